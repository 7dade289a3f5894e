"""A GPU host that cannot work says so when it starts (deploy/, docs/operations.md "The start
checks"): `autopilot worker gpu` against the real API on a loopback port, with real tokens,
refuses to start with one line naming the setting to fix; with everything right it starts, and
SIGTERM stops it. A fetch the forge refuses at preparation names the setting too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import SecretStr

from app.api.main import create_app
from app.db import Stores
from app.git.exceptions import FetchFailed
from app.jobs import service as jobs
from app.projects import service as ops
from app.settings import Settings
from tests.integration.forge.test_http_forge import BRANCH, Forge, forge, server  # noqa: F401
from tests.support import free_port, served
from workers import gpu_host, gpu_start, prepare

NO_GPU_DRIVER = not Path("/dev/nvidiactl").exists()


@dataclass
class Host:
    """A GPU host's settings, as its env file gives them, against the control host's API."""

    env: dict[str, str]
    tokens: dict[str, str]
    root: Path

    def worker(self, *args: str, **env: str | None) -> subprocess.Popen[str]:
        merged = {**self.env, **env}
        return subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", "gpu", *args],
            env={k: v for k, v in merged.items() if v is not None},
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def refused(self, *args: str, **env: str | None) -> str:
        """The one line a worker that does not start prints (it exits 2)."""
        proc = self.worker(*args, **env)
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 2, output
        return output.strip()


@pytest.fixture
def host(settings: Settings, stores: Stores, tmp_path: Path) -> Iterator[Host]:
    tokens = {}
    with stores.ops_session() as session:
        for scope in ("worker", "trigger", "admin"):
            tokens[scope] = ops.create_token(session, f"gpu-{scope}", [scope])[1]
        tokens["revoked"] = ops.create_token(session, "gpu-revoked", ["worker"])[1]
        ops.revoke_token(session, "gpu-revoked")
    root = tmp_path / "gpu-host"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
    with served(create_app(settings, stores)) as url:
        env.update(
            {
                "AUTOPILOT_STATE_DIR": str(root / "state"),
                "AUTOPILOT_OPS_URL": settings.ops_database_url,
                "AUTOPILOT_BROKER_URL": "filesystem://",
                "AUTOPILOT_CONTROL_URL": url,
                "AUTOPILOT_CONTROL_TOKEN": tokens["worker"],
                "AUTOPILOT_SANDBOX": "off",
            }
        )
        yield Host(env, tokens, root)


def test_without_the_token_a_worker_refuses_to_start(host: Host) -> None:
    line = host.refused("--kind", "cpu", AUTOPILOT_CONTROL_TOKEN=None)
    assert "\n" not in line
    assert line.startswith("error: GPU worker not started: AUTOPILOT_CONTROL_TOKEN is not set: ")
    assert "AUTOPILOT_CONTROL_TOKEN=ap_..." in line  # the form it takes
    assert "autopilot token create --name <this host> --scope worker" in line


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("garbage", "AUTOPILOT_CONTROL_TOKEN refused by the API (401"),
        ("revoked", "AUTOPILOT_CONTROL_TOKEN refused by the API (401"),
        ("trigger", "AUTOPILOT_CONTROL_TOKEN accepted, but it lacks scope worker (403"),
    ],
)
def test_a_token_the_api_refuses_is_named(host: Host, token: str, says: str) -> None:
    value = host.tokens.get(token, "ap_garbage-0000")
    line = host.refused("--kind", "cpu", AUTOPILOT_CONTROL_TOKEN=value)
    assert "\n" not in line
    assert line.startswith(f"error: GPU worker not started: {says}")
    assert value not in line


def test_a_control_url_that_is_not_the_api_is_named(host: Host) -> None:
    url = host.env["AUTOPILOT_CONTROL_URL"] + "/nothing-here"
    line = host.refused("--kind", "cpu", AUTOPILOT_CONTROL_URL=url)
    assert line == (
        f"error: GPU worker not started: AUTOPILOT_CONTROL_URL: {url}/healthz answered 404, "
        "not 200: set it to the API's base URL"
    )


@pytest.mark.skipif(not NO_GPU_DRIVER, reason="this host has an NVIDIA driver")
def test_a_gpu_worker_without_its_gpu_is_named(host: Host) -> None:
    line = host.refused("--kind", "h100", "--device", "0")
    assert line.startswith("error: GPU worker not started: --device 0: no NVIDIA driver here")


def test_with_everything_right_it_starts_and_sigterm_stops_it(host: Host, stores: Stores) -> None:
    proc = host.worker("--kind", "cpu", "--device", "0", "--loglevel", "INFO")
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until Celery is up (its SIGTERM handler installed)
            lines.append(line)
            if line.rstrip().endswith(" ready."):
                break
        with stores.ops_session() as session:
            assert [w.kind for w in jobs.list_workers(session)] == ["cpu"]
        os.kill(proc.pid, signal.SIGTERM)  # Celery's warm shutdown
        rest, _ = proc.communicate(timeout=60)
        output = "".join(lines) + rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output
    assert "GPU worker not started" not in output and "warning:" not in output
    assert host.tokens["worker"] not in output


def test_a_token_with_more_than_scope_worker_starts_with_a_warning(host: Host) -> None:
    proc = host.worker("--kind", "cpu", AUTOPILOT_CONTROL_TOKEN=host.tokens["admin"])
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert first.startswith("warning: accepted, but it has more than scope worker")
    assert host.tokens["admin"] not in first


# -- the same checks in-process, and the doctor's --device ---------------------------------------


def gpu_host_settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(_env_file=None, state_dir=tmp_path, sandbox="off", **values)  # type: ignore[call-arg]


def test_an_api_that_does_not_answer_is_a_warning(tmp_path: Path) -> None:
    """The control host may be away (or starting beside the worker): the GPU host runs jobs
    through its outage, so the worker starts and says what it could not check."""
    settings = gpu_host_settings(
        tmp_path,
        control_url=f"http://127.0.0.1:{free_port()}",
        control_token=SecretStr("ap_not-checked"),
    )
    checks = gpu_start.start_checks(settings, "cpu", "0", wait_s=0.3)
    assert all(c.ok for c in checks)
    (warned,) = [c for c in checks if c.warn]
    assert warned.name == "control-url"
    assert "gave no answer within 0.3 s" in warned.detail and "starting anyway" in warned.detail


def test_devices_are_the_drivers_nodes(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    assert gpu_host.check_devices("cpu", "", dev).ok
    assert "no NVIDIA driver" in gpu_host.check_devices("h100", "0", dev).detail
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia3"):
        (dev / name).touch()
    assert gpu_host.check_devices("h100", "0,1", dev).ok
    missing = gpu_host.check_devices("h100", "1,2", dev)
    assert not missing.ok
    assert f"{dev}/nvidia2 does not exist (present: nvidia0, nvidia1, nvidia3)" in missing.detail
    assert not gpu_host.check_devices("h100", "", dev).ok


@pytest.mark.skipif(not NO_GPU_DRIVER, reason="this host has an NVIDIA driver")
def test_the_doctor_checks_the_devices_too(host: Host) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "doctor", "gpu-host", "--kind", "h100",
         "--device", "0,1", "--json"],
        env=host.env, cwd=host.root, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["devices"]["ok"] is False
    assert checks["devices"]["detail"].startswith("--device 0,1: no NVIDIA driver here")
    assert checks["control-token"]["ok"] is True


# -- preparation: a fetch the forge refuses names the setting ------------------------------------


def source_on(url: str, forge: Forge) -> prepare._Source:  # noqa: F811
    return prepare._Source(
        project="spectral",
        repo=f"{url}/git/spectral.git",
        ref=BRANCH,
        head_sha=forge.branch_sha,
        experiment="probe",
        queue="gpu.cpu",
    )


def test_a_refused_fetch_names_the_setting(
    forge: Forge,  # noqa: F811
    server: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    source = source_on(server, forge)
    cases = [
        ({"control_url": server}, "AUTOPILOT_CONTROL_TOKEN is not set on this GPU host"),
        (
            {"control_url": server, "control_token": SecretStr(forge.tokens["revoked"])},
            "the control host refused AUTOPILOT_CONTROL_TOKEN",
        ),
        (  # the control host names its forge by another URL than this host's setting
            {
                "control_url": server.replace("127.0.0.1", "localhost"),
                "control_token": SecretStr(forge.tokens["worker"]),
            },
            "is not under this host's AUTOPILOT_CONTROL_URL",
        ),
    ]
    for i, (values, says) in enumerate(cases):
        settings = gpu_host_settings(tmp_path / f"host-{i}", **values)
        with pytest.raises(FetchFailed) as failed:
            prepare.export(settings, 1, source)
        assert "could not read Username" in failed.value.detail
        assert says in failed.value.detail
        assert all(token not in failed.value.detail for token in forge.tokens.values())
    # and with the worker token, the same fetch works
    settings = gpu_host_settings(
        tmp_path / "host-ok", control_url=server, control_token=SecretStr(forge.tokens["worker"])
    )
    assert (prepare.export(settings, 1, source) / "src" / "kernel.py").is_file()
