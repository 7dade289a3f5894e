"""The `autopilot` command from another seat: a real subprocess with its own, empty state dir,
talking to the control host's API (served by uvicorn on loopback) with a token; and the
failures a person meets, each one line with exit code 2 and no traceback."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.api.main import create_app
from app.cycles import service as cycles
from app.db import Stores
from app.jobs.models import Job
from app.memory import service as memory
from app.memory.schemas import FindingCreate
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.conftest import Backend
from tests.support import free_port, served

LOG = "[log] warming up\n[log] 1.23 ms per call\n"


def autopilot(
    home: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI as a person runs it, on a machine whose state dir and config dir are `home`'s."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
    full_env["AUTOPILOT_STATE_DIR"] = str(home / "state")
    full_env["XDG_CONFIG_HOME"] = str(home / "config")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=home,
        input=stdin,
        timeout=120,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and needle in line, line
    return line


@dataclass
class Control:
    url: str
    stores: Stores
    reader: str  # scope trigger: reads everything, triggers and cancels
    job_id: int
    finding_id: str


@pytest.fixture
def control(backend: Backend, settings: Settings, stores: Stores) -> Iterator[Control]:
    """The control host: migrated stores with a project, a finished job with a log and a finding, its
    API served on loopback. Once, on the embedded stores: the remote CLI talks to the API, whose
    stores are tested per back end elsewhere (and these tests are slow: real processes)."""
    if backend.name != "sqlite":
        pytest.skip("the remote CLI tests run once, with the embedded stores")
    with stores.ops_session() as session:
        project = ops.create_project(session, ProjectCreate(name="lab", repo_url="/srv/lab"))
        job = Job(
            project_id=project.id,
            experiment="probe",
            queue="gpu.cpu",
            state="succeeded",
            log_tail=LOG,
        )
        session.add(job)
        session.flush()
        job_id = job.id
        token = ops.create_token(session, "alice", ["trigger"])[1]
    with stores.memory_session() as session:
        finding = memory.create(
            session,
            FindingCreate(kind="lesson", statement="Pinning the GPU clock halves the noise."),
            "test",
        )
        finding_id = finding.id
    with served(create_app(settings, stores)) as url:
        yield Control(url, stores, token, job_id, finding_id)


@pytest.fixture
def laptop(tmp_path: Path) -> Path:
    """Another machine: nothing in its state dir, no config."""
    home = tmp_path / "laptop"
    home.mkdir()
    return home


def test_read_and_trigger_commands_go_through_the_api(control: Control, laptop: Path) -> None:
    remote = ("--api", control.url, "--token", control.reader)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        result = autopilot(laptop, *remote, *args)
        assert result.returncode == 0, result.stderr
        return result

    assert [p["name"] for p in json.loads(cli("project", "list", "--json").stdout)] == ["lab"]
    assert "/srv/lab" in cli("project", "list").stdout
    empty = cli("cycle", "list")
    assert empty.stdout == "" and "no cycles yet" in empty.stderr

    cycle = json.loads(cli("cycle", "run", "--project", "lab", "--json").stdout)
    assert cycle["state"] == "planned"
    listed = json.loads(cli("cycle", "list", "--json").stdout)
    assert [c["id"] for c in listed] == [cycle["id"]]
    table = cli("cycle", "list", "--project", "lab").stdout.splitlines()
    assert table[0].split()[:2] == ["ID", "STATE"]
    assert table[1].split()[:2] == [str(cycle["id"]), "planned"]
    shown = json.loads(cli("cycle", "show", str(cycle["id"]), "--json").stdout)
    assert shown["id"] == cycle["id"] and isinstance(shown["steps"], list)
    assert cli("cycle", "cancel", str(cycle["id"])).stdout.strip() == (
        f"cancelled cycle {cycle['id']}"
    )
    with control.stores.ops_session() as session:
        assert cycles.get(session, cycle["id"]).state == "cancelled"

    jobs = json.loads(cli("job", "list", "--json").stdout)
    assert [(j["id"], j["project"]) for j in jobs] == [(control.job_id, "lab")]
    assert cli("job", "logs", str(control.job_id)).stdout == LOG
    followed = cli("job", "logs", str(control.job_id), "--follow")  # server-sent events
    assert followed.stdout == LOG and f"job {control.job_id} succeeded" in followed.stderr

    page = json.loads(cli("memory", "search", "clock", "--json").stdout)
    assert [f["id"] for f in page["items"]] == [control.finding_id]
    assert "halves the noise" in cli("memory", "show", control.finding_id).stdout
    none = cli("memory", "search", "quantum")
    assert none.stdout == "" and "no findings match 'quantum'" in none.stderr

    # the CLI read and wrote nothing of its own machine's stores
    assert not (laptop / "state").exists()
    missing = autopilot(laptop, *remote, "cycle", "show", "999")
    one_line_error(missing, "no cycle 999; list cycles with `autopilot cycle list`")


def test_login_saves_a_checked_token_that_later_commands_use(
    control: Control, laptop: Path
) -> None:
    refused = autopilot(laptop, "login", "--api", control.url, stdin="ap_not-a-token\n")
    one_line_error(refused, "refused the token")
    config = laptop / "config" / "autopilot" / "config.toml"
    assert not config.exists()

    logged = autopilot(laptop, "login", "--api", control.url, stdin=control.reader + "\n")
    assert logged.returncode == 0, logged.stderr
    assert control.reader not in logged.stdout + logged.stderr
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert control.reader in config.read_text()

    listed = autopilot(laptop, "project", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [p["name"] for p in json.loads(listed.stdout)] == ["lab"]
    # the saved token goes only to the API it was saved for
    elsewhere = f"http://127.0.0.1:{free_port()}"
    one_line_error(autopilot(laptop, "--api", elsewhere, "cycle", "list"), "no token for")

    assert autopilot(laptop, "logout").returncode == 0 and not config.exists()


def test_refused_token_and_unreachable_api_are_one_line(control: Control, laptop: Path) -> None:
    wrong = "ap_wrong-token-3f9a"
    refused = autopilot(laptop, "--api", control.url, "--token", wrong, "cycle", "list")
    line = one_line_error(refused, "refused the token")
    assert "autopilot login" in line and wrong not in refused.stderr

    dead = f"http://127.0.0.1:{free_port()}"
    env = {"AUTOPILOT_CONTROL_URL": dead, "AUTOPILOT_TOKEN": control.reader}
    unreachable = autopilot(laptop, "job", "list", env=env)
    assert "unreachable" in one_line_error(unreachable, dead)
    assert control.reader not in unreachable.stderr

    local_only = autopilot(laptop, "--api", control.url, "--token", control.reader, "token", "list")
    one_line_error(local_only, "has no --api form")


def test_local_store_failures_are_one_line_and_debug_shows_the_traceback(laptop: Path) -> None:
    before_upgrade = autopilot(laptop, "project", "list")
    one_line_error(before_upgrade, "run `autopilot db upgrade`")

    closed = f"postgresql+psycopg://ops:pw-9d1e@127.0.0.1:{free_port()}/ops"
    down = autopilot(laptop, "project", "list", env={"AUTOPILOT_OPS_URL": closed})
    line = one_line_error(down, "Connection refused")
    assert "AUTOPILOT_OPS_URL" in line and "pw-9d1e" not in down.stderr

    debug = autopilot(laptop, "cycle", "list", env={"AUTOPILOT_DEBUG": "1"})
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_empty_lists_say_so_and_version(laptop: Path) -> None:
    assert autopilot(laptop, "db", "upgrade").returncode == 0
    for args, said in [
        (("project", "list"), "no projects yet"),
        (("cycle", "list"), "no cycles yet"),
        (("cycle", "list", "--state", "planned"), "no cycles match --state planned"),
        (("job", "list"), "no jobs yet"),
        (("memory", "search", ""), "no findings yet"),
    ]:
        result = autopilot(laptop, *args)
        assert result.returncode == 0 and result.stdout == "", (args, result.stderr)
        assert said in result.stderr, args
    assert json.loads(autopilot(laptop, "cycle", "list", "--json").stdout) == []

    version = autopilot(laptop, "--version")
    assert version.returncode == 0 and version.stdout.startswith("autopilot 0.")
    assert "--install-completion" in autopilot(laptop, "--help").stdout


def test_a_dotenv_in_the_working_directory_cannot_redirect_the_token(laptop: Path) -> None:
    """A research repo's checkout may hold a `.env`: its AUTOPILOT_CONTROL_URL does not get a
    token that came from the environment or --token (it would be the repo's to choose where
    the token goes)."""
    secret = "ap_from-the-environment-7c2e"
    with socket.socket() as trap:  # where the file points: anything that connects is seen
        trap.bind(("127.0.0.1", 0))
        trap.listen(4)
        trap.setblocking(False)
        url = f"http://127.0.0.1:{trap.getsockname()[1]}"
        (laptop / ".env").write_text(f"AUTOPILOT_CONTROL_URL={url}\n")
        for args, env in [
            (("cycle", "list"), {"AUTOPILOT_TOKEN": secret}),
            (("--token", secret, "job", "list"), {}),
        ]:
            result = autopilot(laptop, *args, env=env)
            line = one_line_error(result, "comes from ./.env, the token does not")
            assert secret not in result.stderr + result.stdout, line
        # An empty AUTOPILOT_CONTROL_URL is unset, not a URL built from the file's host/port.
        port = trap.getsockname()[1]
        (laptop / ".env").write_text(f"AUTOPILOT_HOST=127.0.0.1\nAUTOPILOT_PORT={port}\n")
        built = autopilot(
            laptop, "cycle", "list", env={"AUTOPILOT_CONTROL_URL": "", "AUTOPILOT_TOKEN": secret}
        )
        assert secret not in built.stderr + built.stdout
        with pytest.raises(BlockingIOError):
            trap.accept()  # nothing connected

        # Both from the same file: the file's own pair is used as it says (here: unreachable).
        (laptop / ".env").write_text(f"AUTOPILOT_CONTROL_URL={url}\nAUTOPILOT_TOKEN={secret}\n")
        trap.close()
        same_file = autopilot(laptop, "cycle", "list")
        assert "unreachable" in one_line_error(same_file, url)
