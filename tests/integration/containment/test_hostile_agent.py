"""A hostile command agent, end to end (real control and GPU workers, the sandbox on): what it
tries fails, and its cycle still settles (docs/design.md, "Hosts and boundaries")."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.integration.containment import agents
from tests.integration.containment.conftest import canary_env
from tests.integration.dashboard.conftest import login
from tests.integration.queue.conftest import Workers
from tests.support import bearer, wait_for

pytestmark = pytest.mark.slow

SETTLED = ("awaiting_review", "failed")
PACK_FAILED = "committing the agent's changes failed"


def run_cycles(client: TestClient, token: str, projects: list[str]) -> dict[str, dict[str, Any]]:
    """One cycle per project, started together; each one's API answer once it settled."""
    ids = {
        p: client.post("/api/v1/cycles", json={"project": p}, headers=bearer(token)).json()["id"]
        for p in projects
    }

    def settled() -> dict[str, dict[str, Any]] | None:
        bodies = {
            p: client.get(f"/api/v1/cycles/{i}", headers=bearer(token)).json()
            for p, i in ids.items()
        }
        return bodies if all(b["state"] in SETTLED for b in bodies.values()) else None

    return wait_for(settled, timeout=240, interval=0.2)


def start(workers: Workers, canary: str) -> None:
    workers.start("control", "control", env=canary_env(canary))
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0", env=canary_env(canary))


def register(stores: Stores, repos: list[Path]) -> str:
    with stores.ops_session() as session:
        for repo in repos:
            ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        return ops.create_token(session, "ci", ["trigger", "review"])[1]


def git_history(bare: Path) -> str:
    """Every commit of every ref with its full patch (binary ones too)."""
    if not bare.exists():
        return ""
    return subprocess.run(  # noqa: S603
        ["git", "--git-dir", str(bare), "log", "-p", "--binary", "--all", "--format=%H %B"],  # noqa: S607
        capture_output=True,
        text=True,
        errors="replace",
        check=True,
    ).stdout


def paths_in_history(bare: Path) -> set[str]:
    if not bare.exists():
        return set()
    out = subprocess.run(  # noqa: S603
        ["git", "--git-dir", str(bare), "log", "--all", "--name-only", "--format="],  # noqa: S607
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line for line in out.splitlines() if line}


def forms(secret: str) -> list[str]:
    """The secret as it would travel: plain, base64, and as the Basic credential git sends."""
    return [
        secret,
        base64.b64encode(secret.encode()).decode(),
        base64.b64encode(f"x-access-token:{secret}".encode()).decode(),
    ]


def files_holding(roots: list[Path], needle: bytes) -> list[Path]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    if needle in path.read_bytes():
                        found.append(path)
    return found


def processes_with(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
    return pids


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def test_hostile_agent_gets_no_secret_no_host_path_and_no_lasting_process(
    workers: Workers, stores: Stores, outside: Path, canary: str, tmp_path: Path
) -> None:
    """Attacks 1, 2, 4, 7 and 9 in one cycle: environ harvesting committed into the repo, hooks
    (its clone's, the mirror's, the forge's), writes at host paths, a detached daemon. The
    cycle runs the agent's legitimate proposal to review; nothing of it leaks."""
    state = workers.settings.state_dir.absolute()
    name = "hostile"
    mirror, forge = state / "repos" / f"{name}.git", state / "forge" / f"{name}.git"
    markers = outside / "markers"
    markers.mkdir()
    other = state / "cycles" / "999" / "agent" / "work" / "files"  # another cycle's workspace
    other.mkdir(parents=True)
    (other / "proposal.json").write_text('{"hypothesis": "theirs"}')
    checkout = Path(__file__).resolve().parents[3]
    service = Path("/work/main")
    source = tmp_path / name
    payload, daemon = f"PWNED-{uuid.uuid4().hex}", f"marker-{uuid.uuid4().hex}"
    static = [  # host files that nothing but an attack would change
        other / "proposal.json",
        service / "app" / "__init__.py",
        service / ".venv" / "pyvenv.cfg",
        checkout / "app" / "__init__.py",
        source / "probe" / "main.py",
    ]
    created = [  # must not appear
        state / "pwned.txt",
        other / "pwned.txt",
        service / "pwned.txt",
        markers / "direct.txt",
    ]
    grown = [  # made by the service during the cycle; must not carry the payload
        state / "ops.db",
        state / "memory.db",
        state / "session_secret",
        mirror / "config",
        mirror / "HEAD",
        forge / "config",
    ]
    targets = {
        "markers": str(markers),
        "payload": payload,
        "daemon": daemon,
        "foreign_hooks": [str(mirror / "hooks"), str(forge / "hooks")],
        "write_targets": [str(p) for p in static + created + grown],
        "exists_targets": [
            str(p)
            for p in (
                state / "ops.db",
                state / "session_secret",
                mirror,
                forge,
                state / "cycles" / "999",
                service / "app",
                checkout / "app",
                source / ".git",
                markers,
            )
        ],
    }
    repo = agents.hostile_repo(tmp_path, name, agents.program(agents.HOSTILE, targets))
    token = register(stores, [repo])
    before = {p: digest(p) for p in static}
    start(workers, canary)
    # The canary really is in the service's environment (the test could fail).
    control_env = Path(f"/proc/{workers.procs['control'].pid}/environ").read_bytes()
    assert canary.encode() in control_env
    try:
        with TestClient(create_app(workers.settings, stores)) as client:
            cycle = run_cycles(client, token, [name])[name]
            assert cycle["state"] == "awaiting_review", (cycle, workers.logs())
            cycle_id = cycle["id"]
            answers = [
                client.get(path, headers=bearer(token)).text
                for path in (f"/api/v1/cycles/{cycle_id}", "/api/v1/cycles", "/api/v1/jobs")
            ]
            answers.append(client.get("/api/v1/projects", headers=bearer(token)).text)
            login(client, token)
            page = client.get(f"/dashboard/cycles/{cycle_id}")
            assert page.status_code == 200
            answers.append(page.text)
        files = state / "cycles" / str(cycle_id) / "agent" / "work" / "files"
        report = json.loads((files / "report.json").read_text())

        # 7. The daemon ran inside, and nothing of it is left on the host.
        assert report["daemon_alive_inside"] is True
        wait_for(lambda: not processes_with(daemon), timeout=10)

        # 1 and 9. The harvest was committed and pushed: the forge has it, without the canary.
        shown = subprocess.run(  # noqa: S603
            ["git", "--git-dir", str(forge), "show", f"{cycle['branch']}:loot/environ.txt"],  # noqa: S607
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "/proc/1/environ" in shown
        agent_env = json.loads((files / "environ.json").read_text())
        for secret in forms(canary):
            assert secret not in shown
            assert secret not in git_history(forge)
            assert secret not in git_history(mirror)
            assert secret not in json.dumps(agent_env)
            for answer in answers:
                assert secret not in answer
            # every log and file of the run: worker logs, job logs, the agent's output.log,
            # the stores, the workspaces
            assert files_holding([outside, tmp_path], secret.encode()) == []
        assert not {k for k in agent_env if k.startswith("AUTOPILOT_")} - {
            "AUTOPILOT_PROMPT",
            "AUTOPILOT_CONTEXT",
            "AUTOPILOT_PROPOSAL",
        }, agent_env
        assert "HOSTILE_CANARY" not in agent_env

        # 2. Hooks: no marker on the host; the mirror's and forge's hooks were unreachable.
        assert sorted(markers.iterdir()) == []
        for hooks in (mirror / "hooks", forge / "hooks"):
            planted = [p.name for p in hooks.iterdir() if not p.name.endswith(".sample")]
            assert planted == [], hooks

        # 4. Writes outside: every one refused, no such path even visible from inside.
        # (A path under /tmp is written inside, to the sandbox's private tmpfs: the digests
        # below show the host's file unchanged.)
        written = {
            k: v for k, v in report["write"].items() if not k.startswith(("clone:", "/tmp/"))
        }
        assert len(written) > 20 and all(v != "written" for v in written.values()), written
        assert report["exists"] and not any(report["exists"].values()), report["exists"]
        assert {p: digest(p) for p in static} == before
        assert [p for p in created if p.exists()] == []
        for path in grown:
            if path.exists():
                assert payload.encode() not in path.read_bytes(), path
        assert files_holding([state / "repos", state / "forge"], payload.encode()) == []
        print(  # noqa: T201 - shown with -s: what ran inside (hooks), for the record
            "hooks that ran inside the sandbox:",
            (files / "hooks-ran").read_text().split() if (files / "hooks-ran").exists() else [],
        )
    finally:
        for pid in processes_with(daemon):  # only if the test failed: our own escaped daemon
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_gitfile_swap_runs_nothing_on_the_host(
    workers: Workers, stores: Stores, outside: Path, canary: str, tmp_path: Path
) -> None:
    """Attack 3: the clone's .git becomes a gitfile, to an evil copy whose config names an
    fsmonitor and a hooks dir that write host markers, or to the host's mirror itself. No
    marker appears, the mirror is untouched, and each cycle settles."""
    state = workers.settings.state_dir.absolute()
    markers = outside / "markers"
    markers.mkdir()
    repos = []
    for name, gitdir in (
        ("gitfile-evil", "evil"),
        ("gitfile-mirror", str(state / "repos" / "gitfile-mirror.git")),
    ):
        targets = {"markers": str(markers), "gitdir": gitdir}
        repos.append(agents.hostile_repo(tmp_path, name, agents.program(agents.GITFILE, targets)))
    token = register(stores, repos)
    start(workers, canary)
    with TestClient(create_app(workers.settings, stores)) as client:
        cycles = run_cycles(client, token, [r.name for r in repos])
    assert sorted(markers.iterdir()) == []
    outcomes = {}
    for name, cycle in cycles.items():
        mirror = state / "repos" / f"{name}.git"
        assert not (mirror / "index").exists(), "git ran with the mirror as a work tree's git dir"
        config = (mirror / "config").read_text()
        assert "fsmonitor" not in config and "hooksPath" not in config
        assert not any(".git" in p.split("/") for p in paths_in_history(mirror))
        outcomes[name] = (cycle["state"], cycle["error"])
    evil_state, _ = outcomes["gitfile-evil"]
    # The evil gitdir is a working repository inside the sandbox: its commit comes back as
    # objects and the cycle proceeds with the change (its fsmonitor and hooks ran, if at all,
    # only in there).
    assert evil_state == "awaiting_review", (outcomes, workers.logs())
    assert "probe/tuning.py" in paths_in_history(state / "forge" / "gitfile-evil.git")
    # The mirror's path does not exist inside the sandbox: packing fails and says so.
    mirror_state, mirror_error = outcomes["gitfile-mirror"]
    assert mirror_state == "failed", outcomes
    assert PACK_FAILED in mirror_error, outcomes


PLANTED = {
    "plant-pycache": ("pycache", "probe/__pycache__/main.cpython-311.pyc", "__pycache__"),
    "plant-pyc": ("pyc", "evil.pyc", "bytecode"),
    "plant-link": ("link", "link", "may only point down into the repository"),
    "plant-up": ("up", "up", "may only point down into the repository"),
}


def test_refused_entries_fail_the_cycle_and_reach_no_branch(
    workers: Workers, stores: Stores, canary: str, tmp_path: Path
) -> None:
    """Attacks 5 and 6, one project each: planted bytecode (in `__pycache__`, and a top-level
    `evil.pyc`), a symlink to the state dir and one up out of the repository. Each cycle fails
    before any GPU work, naming the entry, and no branch carries it."""
    state = workers.settings.state_dir.absolute()
    repos = [
        agents.hostile_repo(
            tmp_path, name, agents.program(agents.PLANT, {"plant": kind, "state": str(state)})
        )
        for name, (kind, _, _) in PLANTED.items()
    ]
    token = register(stores, repos)
    start(workers, canary)
    with TestClient(create_app(workers.settings, stores)) as client:
        cycles = run_cycles(client, token, list(PLANTED))
    for name, (_, entry, why) in PLANTED.items():
        cycle = cycles[name]
        assert cycle["state"] == "failed", (name, cycle, workers.logs())
        assert "refused" in cycle["error"] and f"{entry}:" in cycle["error"], (name, cycle)
        assert why in cycle["error"], (name, cycle["error"])
        assert cycle["job_id"] is None
        for bare in (state / "forge" / f"{name}.git", state / "repos" / f"{name}.git"):
            held = paths_in_history(bare)
            assert entry not in held and "probe/tuning.py" not in held, (name, bare)
