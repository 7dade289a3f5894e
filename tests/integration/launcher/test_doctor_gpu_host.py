"""`autopilot doctor gpu-host` against real services: the API served by uvicorn on a loopback
port with real tokens, the migrated ops DB, Redis when AUTOPILOT_TEST_REDIS_URL is set (else the
filesystem broker of a one-machine setup stands in), and real git."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app import migrate
from app.api.main import create_app
from app.db import Stores
from app.projects import service as ops
from app.settings import Settings
from tests.conftest import REDIS_URL
from tests.support import free_port, served
from workers.launcher.cli import doctor_app

# Both stacks: a GPU host's doctor reaches the production ops DB.
pytestmark = pytest.mark.stores("sqlite", "postgres")

runner = CliRunner()
SECRET = "ghp_not-for-gpu-hosts-7f3a91"


@dataclass
class Host:
    """A GPU host's directory (its working dir and state dir) and its env variables."""

    root: Path
    env: dict[str, str]
    tokens: dict[str, str]

    def doctor(self, *args: str, **env: str | None) -> tuple[int, str]:
        merged = {**self.env, **env}
        variables = {k: v for k, v in merged.items() if v is not None}
        result = runner.invoke(doctor_app, ["gpu-host", *args], env=variables)
        return result.exit_code, result.output


@pytest.fixture
def host(
    settings: Settings, stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Host:
    """The control host's API on a real port and a GPU host set up as the docs say: its own
    state dir, the broker and ops DB URLs, the control URL and a worker token."""
    tokens = {}
    with stores.ops_session() as session:
        for scope in ("worker", "trigger", "admin"):
            tokens[scope] = ops.create_token(session, f"gpu-{scope}", [scope])[1]
        tokens["revoked"] = ops.create_token(session, "gpu-revoked", ["worker"])[1]
        ops.revoke_token(session, "gpu-revoked")
    root = tmp_path / "gpu-host"
    state = root / "state"
    state.mkdir(parents=True)
    for name in list(os.environ):
        if name.startswith("AUTOPILOT_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(root)  # its own (empty) working dir: no .env but the one a test writes
    broker = REDIS_URL or "filesystem://"
    if broker == "filesystem://":
        (state / "broker" / "queue").mkdir(parents=True)
    env = {
        "AUTOPILOT_STATE_DIR": str(state),
        "AUTOPILOT_BROKER_URL": broker,
        "AUTOPILOT_OPS_URL": settings.ops_database_url,
        "AUTOPILOT_CONTROL_TOKEN": tokens["worker"],
    }
    return Host(root, env, tokens)


@pytest.fixture
def api(settings: Settings, stores: Stores, host: Host) -> Iterator[str]:
    with served(create_app(settings, stores)) as url:
        host.env["AUTOPILOT_CONTROL_URL"] = url
        yield url


def checks(output: str) -> list[tuple[str, str, str]]:
    """(status, name, detail) of each check line."""
    found = []
    for line in output.splitlines():
        status, _, rest = line.partition("  ")
        if status.strip() in ("ok", "FAIL"):
            name, _, detail = rest.strip().partition(" ")
            found.append((status.strip(), name, detail.strip()))
    return found


def failing(output: str) -> dict[str, str]:
    return {name: detail for status, name, detail in checks(output) if status == "FAIL"}


def test_a_worker_token_passes_every_check(host: Host, api: str) -> None:
    code, output = host.doctor("--kind", "h100")
    assert code == 0, output
    names = [name for _, name, _ in checks(output)]
    assert names == [
        "settings", "no-secrets", "state-dir", "broker", "ops-db", "control-url",
        "control-token", "git", "runtime-dir", "sandbox", "gpu-kind",
    ]  # fmt: skip
    assert failing(output) == {}
    assert output.rstrip().endswith("11 checks, all passed")
    detail = {name: d for _, name, d in checks(output)}
    assert detail["control-token"].startswith("accepted with scope worker")
    assert detail["control-url"] == f"{api}/healthz answers 200"
    assert "schema at 20" in detail["ops-db"]
    assert detail["git"].startswith("git version ")
    assert detail["sandbox"].startswith("bubblewrap and cgroup v2 work")
    assert host.tokens["worker"] not in output

    code, output = host.doctor("--json")
    report = json.loads(output)
    assert code == 0 and report["ok"] is True
    assert all(c["ok"] for c in report["checks"])


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("trigger", "accepted, but it lacks scope worker (403"),
        ("admin", "accepted, but it has more than scope worker"),
        ("revoked", "refused by the API (401"),
        ("garbage", "refused by the API (401"),
    ],
)
def test_a_token_that_is_not_a_worker_token_fails(
    host: Host, api: str, token: str, says: str
) -> None:
    value = host.tokens.get(token, "ap_garbage-token-0000")
    code, output = host.doctor(AUTOPILOT_CONTROL_TOKEN=value)
    assert code == 1
    assert list(failing(output)) == ["control-token"], output
    assert failing(output)["control-token"].startswith(says)
    assert "autopilot token create --name <this host> --scope worker" in output
    assert value not in output


def test_no_token(host: Host, api: str) -> None:
    code, output = host.doctor(AUTOPILOT_CONTROL_TOKEN=None)
    assert code == 1
    assert failing(output) == {
        "control-token": "AUTOPILOT_CONTROL_TOKEN is not set: create one on the control host: "
        "`autopilot token create --name <this host> --scope worker`"
    }


def test_a_missing_or_dead_control_url_fails(host: Host) -> None:
    code, output = host.doctor()  # no AUTOPILOT_CONTROL_URL: the default is this machine
    assert code == 1
    failed = failing(output)
    assert set(failed) == {"control-url", "control-token"}, output
    assert failed["control-url"].startswith("AUTOPILOT_CONTROL_URL is not set")
    assert failed["control-token"].startswith("not checked")

    dead = f"http://127.0.0.1:{free_port()}"
    code, output = host.doctor(AUTOPILOT_CONTROL_URL=dead)
    assert code == 1
    assert failing(output)["control-url"].startswith(f"{dead}/healthz gave no answer")


def test_forge_and_session_secrets_fail_by_name_never_by_value(host: Host, api: str) -> None:
    (host.root / ".env").write_text("AUTOPILOT_SESSION_SECRET=session-secret-value-42\n")
    code, output = host.doctor(AUTOPILOT_GITHUB_TOKEN=SECRET)
    assert code == 1
    secrets = [d for s, n, d in checks(output) if n == "no-secrets" and s == "FAIL"]
    assert secrets == [
        "remove it from the GPU host: AUTOPILOT_GITHUB_TOKEN is set (in the environment); the "
        "forge token pushes branches and opens pull requests; only the control host holds it "
        "(with GitHub, this host fetches with read-only credentials of its own)",
        "remove it from the GPU host: AUTOPILOT_SESSION_SECRET is set (in the .env file); it "
        "signs dashboard sessions: whoever holds it can forge a login",
    ]
    assert set(failing(output)) == {"no-secrets"}
    assert SECRET not in output and "session-secret-value-42" not in output

    code, output = host.doctor(
        "--json", AUTOPILOT_GITHUB_APP_PRIVATE_KEY=SECRET, AUTOPILOT_MEMORY_URL="sqlite:///m.db"
    )
    assert code == 1 and SECRET not in output
    named = [c["detail"] for c in json.loads(output)["checks"] if not c["ok"]]
    assert any("AUTOPILOT_GITHUB_APP_PRIVATE_KEY is set" in d for d in named)
    assert any("AUTOPILOT_MEMORY_URL is set" in d for d in named)


def test_an_ops_db_missing_or_not_migrated_fails(host: Host, api: str) -> None:
    missing = host.root / "nowhere.db"
    code, output = host.doctor(AUTOPILOT_OPS_URL=f"sqlite:///{missing}")
    assert code == 1
    assert failing(output)["ops-db"] == (
        f"sqlite:///{missing}: no such file: AUTOPILOT_OPS_URL must name the control host's ops DB"
    )
    assert not missing.exists()  # the doctor did not create it

    empty = host.root / "empty.db"
    sqlite3.connect(empty).close()
    code, output = host.doctor(AUTOPILOT_OPS_URL=f"sqlite:///{empty}")
    assert code == 1
    assert "has no tables: run `autopilot db upgrade` on the control host" in output

    code, output = host.doctor(AUTOPILOT_OPS_URL=None)
    assert failing(output)["ops-db"].startswith("AUTOPILOT_OPS_URL is not set")

    behind = Settings(_env_file=None, state_dir=host.root / "behind")  # type: ignore[call-arg]
    migrate.upgrade(behind)
    migrate.downgrade(behind, "-1")
    code, output = host.doctor(AUTOPILOT_OPS_URL=behind.ops_database_url)
    assert code == 1
    assert "this code expects" in failing(output)["ops-db"]
    assert "run `autopilot db upgrade` on the control host" in failing(output)["ops-db"]


def test_a_broker_that_does_not_answer_fails_without_its_password(host: Host, api: str) -> None:
    url = f"redis://:broker-pw-8c1d@127.0.0.1:{free_port()}/0"
    code, output = host.doctor(AUTOPILOT_BROKER_URL=url)
    assert code == 1
    assert list(failing(output)) == ["broker"]
    assert failing(output)["broker"].startswith(
        f"redis://:***@127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]}/0 gave no PING answer"
    )
    assert "broker-pw-8c1d" not in output


def test_the_state_dir_must_be_given_and_exist(host: Host, api: str) -> None:
    gone = host.root / "gone"
    code, output = host.doctor(AUTOPILOT_STATE_DIR=str(gone))
    assert code == 1
    assert failing(output)["state-dir"].startswith(f"{gone} does not exist")
    assert "runtime-dir" not in output  # not tried without a state dir
    code, output = host.doctor(AUTOPILOT_STATE_DIR=None)
    assert failing(output)["state-dir"].startswith("AUTOPILOT_STATE_DIR is not set")


def test_bad_settings_fail_without_their_secrets(host: Host) -> None:
    code, output = host.doctor(AUTOPILOT_CONTROL_URL="http://gpu:url-pw-5e2b@control.lab:8000")
    assert code == 1
    assert [name for _, name, _ in checks(output)] == ["settings"]
    assert "AUTOPILOT_CONTROL_URL: must not hold credentials" in output
    assert "url-pw-5e2b" not in output


def test_an_unknown_gpu_kind_fails(host: Host, api: str) -> None:
    code, output = host.doctor("--kind", "tpu")
    assert code == 1
    assert failing(output)["gpu-kind"].startswith("'tpu' is not a configured GPU kind")


def test_the_sandbox_line_says_when_experiments_run_unconfined(host: Host) -> None:
    code, output = host.doctor(AUTOPILOT_SANDBOX="off")
    detail = {name: d for _, name, d in checks(output)}
    assert detail["sandbox"].startswith("off (AUTOPILOT_SANDBOX=off): experiments run unconfined")
