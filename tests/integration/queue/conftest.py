"""Real worker processes (control + one gpu.cpu) on a real broker, and a small research repo."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import git
import pytest
from pydantic import SecretStr

from app.db import Stores
from app.projects import service as ops
from app.settings import Settings
from tests.conftest import Backend, need_redis
from tests.support import free_port, port_open, wait_for

REPO_ROOT = Path(__file__).resolve().parents[3]

PROBE = '''
"""A tiny experiment: reports its first line, records each run, sleeps, writes raw samples."""
import json, os, socket, subprocess, sys, time

def send(event):
    path = os.environ.get("AUTOPILOT_EVENTS")
    if path:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall((json.dumps(event) + "\\n").encode())
        s.close()

send({"type": "started"})
spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))
params = spec["parameters"]
here = os.path.dirname(os.path.abspath("."))
try:  # beside its export: the sandbox has no such dir (or a throwaway one)
    with open(os.path.join(here, "runs.txt"), "a") as f:
        f.write(f"{os.getpid()}\\n")
except OSError:
    pass
if params.get("grandchild"):
    child = subprocess.Popen(["sleep", "300"])
    try:
        open(os.path.join(here, "grandchild.pid"), "w").write(str(child.pid))
    except OSError:
        pass
time.sleep(params["sleep_s"])
# Raw paired samples (fixed, so a re-run judges the same) for the control plane to judge.
a = [1000000 + 997 * (i % 5) for i in range(10)]
b = [v + 311 * ((3 * i) % 4) - 400 for i, v in enumerate(a)]
pairs = {"a_ns": a, "b_ns": b}
json.dump({"status": "ok", "experiment": spec["experiment"], "parameters": params,
           "noise_floor": {"samples": pairs},
           "comparisons": [{"variant": "probe", "baseline": "base", "samples": pairs,
                            "accuracy": {"max_abs_error": 0.0, "scale": 1.0}}]},
          open(os.environ["AUTOPILOT_RESULT"], "w"))
'''

CONFIG = """
[project]
name = "{name}"
gpu_kind = "cpu"
python_requirements = []

[experiments.probe]
entry = "probe.main"
time_limit_s = 120

[experiments.probe.parameters]
sleep_s = [0.05, 0.2, 0.5, 3, 60]
grandchild = [0, 1]

[experiments.probe.defaults]
sleep_s = 0.05
grandchild = 0
"""


def make_repo(root: Path, name: str) -> Path:
    repo_dir = root / name
    (repo_dir / "probe").mkdir(parents=True)
    (repo_dir / "probe" / "__init__.py").write_text("")
    (repo_dir / "probe" / "main.py").write_text(textwrap.dedent(PROBE))
    (repo_dir / "autopilot.toml").write_text(CONFIG.format(name=name))
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["probe/__init__.py", "probe/main.py", "autopilot.toml"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("probe project", author=actor, committer=actor)
    return repo_dir


@pytest.fixture(scope="session")
def shared_venv_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Project venvs are keyed by requirements; sharing the root builds one once per session.
    return tmp_path_factory.mktemp("venvs")


@pytest.fixture
def broker_url(backend: Backend) -> str:
    """The broker of the stack: the filesystem transport with the embedded SQLite stores,
    Redis with PostgreSQL, as in production."""
    if backend.name == "sqlite":
        return "filesystem://"
    url = need_redis()
    import redis

    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture
def queue_settings(
    settings: Settings, broker_url: str, shared_venv_root: Path, queue_sandbox: str
) -> Settings:
    return settings.model_copy(
        update={
            # The API GPU workers fetch the forge from (started with the first GPU worker).
            "control_url": f"http://127.0.0.1:{free_port()}",
            "broker_url": broker_url,
            "venv_system_site_packages": True,
            "venv_root": shared_venv_root,
            "lease_ttl_s": 5.0,
            "heartbeat_interval_s": 0.5,
            "reaper_interval_s": 1.0,
            "doorbell_stale_s": 2.0,
            "sandbox": queue_sandbox,
        }
    )


def settings_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
    env.update(
        {
            "AUTOPILOT_STATE_DIR": str(settings.state_dir),
            "AUTOPILOT_MEMORY_URL": settings.memory_database_url,
            "AUTOPILOT_OPS_URL": settings.ops_database_url,
            "AUTOPILOT_BROKER_URL": settings.broker_url,
            "AUTOPILOT_VENV_SYSTEM_SITE_PACKAGES": "true",
            "AUTOPILOT_VENV_ROOT": str(settings.venv_root),
            "AUTOPILOT_LEASE_TTL_S": str(settings.lease_ttl_s),
            "AUTOPILOT_HEARTBEAT_INTERVAL_S": str(settings.heartbeat_interval_s),
            "AUTOPILOT_REAPER_INTERVAL_S": str(settings.reaper_interval_s),
            "AUTOPILOT_DOORBELL_STALE_S": str(settings.doorbell_stale_s),
            "AUTOPILOT_SCHEDULE_TICK_S": str(settings.schedule_tick_s),
            "AUTOPILOT_CONTROL_URL": settings.control_url,
            "AUTOPILOT_SANDBOX": settings.sandbox,
        }
    )
    if settings.control_token is not None:
        env["AUTOPILOT_CONTROL_TOKEN"] = settings.control_token.get_secret_value()
    return env


@dataclass
class Workers:
    settings: Settings
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(
        self,
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        exit_after_step: str | None = None,
        faults: list[str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """A worker process (`autopilot-worker <args>`); with `exit_after_step`, one that dies
        hard right after a cycle step commits, and with `faults`, those of `tests/faults.py`."""
        if args and args[0] == "gpu" and "api" not in self.procs:
            self.start_api()  # GPU hosts fetch each job's commit from the API's git endpoint
        argv = ["worker", *args, "--loglevel", "WARNING"]
        if exit_after_step is not None:
            faults = [*(faults or []), "--exit-after-step", exit_after_step]
        if faults:
            return self._spawn(name, argv, env, faults=faults)
        return self._spawn(name, argv, env)

    def start_api(self) -> None:
        port = int(self.settings.control_url.rsplit(":", 1)[1])
        self._spawn("api", ["serve", "--host", "127.0.0.1", "--port", str(port)], None)
        wait_for(lambda: port_open(port), timeout=60)

    def _spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None,
        faults: list[str] | None = None,
    ) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        entry = ["workers.cli"] if faults is None else ["tests.faults", *faults, "--"]
        extra = {} if faults is None else {"PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.Popen(
            [sys.executable, "-m", *entry, *argv],
            env={**settings_env(self.settings), **extra, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.settings.state_dir,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    @staticmethod
    def host_argv(hostname: str, hidden: list[Path], command: list[str]) -> list[str]:
        """`command` as if on another machine (root only): its own UTS namespace with
        `hostname`, its own mount namespace (private propagation) in which each `hidden`
        directory of the control host lies under an empty tmpfs."""
        script = (
            'set -eu; hostname "$1"; shift; '
            'while [ "$1" != -- ]; do mount -t tmpfs -o size=1m,mode=0755 hidden "$1"; shift; done; '
            'shift; exec "$@"'
        )
        return [
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "--fork",
            "--kill-child",
            "sh",
            "-c",
            script,
            "gpu-host",
            hostname,
            *(str(p) for p in hidden),
            "--",
            *command,
        ]

    def start_gpu_host(
        self, name: str, hostname: str, state_dir: Path, hidden: list[Path], device: str = "0"
    ) -> subprocess.Popen[bytes]:
        """A GPU worker on a GPU host of its own (see `host_argv`): its own state dir and only
        a GPU host's settings (docs/design.md, "Hosts and boundaries"); no memory DB, no forge token,
        no session secret. `kill(name)` kills the whole host."""
        if "api" not in self.procs:
            self.start_api()
        s = self.settings
        assert s.control_token is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
        env.update(
            {
                "AUTOPILOT_BROKER_URL": s.broker_url,
                "AUTOPILOT_OPS_URL": s.ops_database_url,
                "AUTOPILOT_CONTROL_URL": s.control_url,
                "AUTOPILOT_CONTROL_TOKEN": s.control_token.get_secret_value(),
                "AUTOPILOT_STATE_DIR": str(state_dir),
                "AUTOPILOT_VENV_ROOT": str(s.venv_root),
                "AUTOPILOT_VENV_SYSTEM_SITE_PACKAGES": str(s.venv_system_site_packages).lower(),
                "AUTOPILOT_LEASE_TTL_S": str(s.lease_ttl_s),
                "AUTOPILOT_HEARTBEAT_INTERVAL_S": str(s.heartbeat_interval_s),
                "AUTOPILOT_SANDBOX": s.sandbox,
            }
        )
        state_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "workers.cli", "worker", "gpu", "--kind", "cpu"]
        command += ["--device", device, "--loglevel", "WARNING"]
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            self.host_argv(hostname, hidden, command),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=state_dir,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """Kill the process `name` and everything of its process group: a worker that died
        by itself may have left its children (a pool, beat) running in the group."""
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("*.log")))


@pytest.fixture
def workers(queue_settings: Settings, stores: Stores, tmp_path: Path) -> Iterator[Workers]:
    queue_settings.state_dir.mkdir(parents=True, exist_ok=True)
    (tmp_path / "worker-logs").mkdir()
    with stores.ops_session() as session:  # the GPU hosts' token (scope worker)
        _, token = ops.create_token(session, "gpu-hosts", ["worker"])
    settings = queue_settings.model_copy(update={"control_token": SecretStr(token)})
    running = Workers(settings, tmp_path / "worker-logs")
    yield running
    running.stop_all()
