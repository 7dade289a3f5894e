"""A hostile experiment under the sandbox: every attempt to reach past its own dirs fails, and
the job still settles with an outcome (real bwrap, cgroups, processes and venv; no mocks)."""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import alive, living_with, wait_for
from workers.launcher.launch import LaunchSpec
from workers.launcher.runner import Outcome, run_job
from workers.launcher.runtime import RuntimeDir
from workers.launcher.spare import Spare
from workers.launcher.venv import Venv, inherited_site_dirs

CHECKOUT = Path(__file__).resolve().parents[3]

HOSTILE = """
import json, os, py_compile, socket, sys

spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))["params"]
found = {}

def attempt(name, fn):
    try:
        found[name] = {"ok": True, "value": fn()}
    except Exception as exc:
        found[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

def read(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")

def write(path):
    with open(path, "w") as f:
        f.write("pwned")
    return path

def connect(port):
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    return port

attempt("environ_parent", lambda: read(f"/proc/{os.getppid()}/environ"))
attempt("environ_init", lambda: read("/proc/1/environ"))
attempt("environ_own", lambda: dict(os.environ))
attempt("processes", lambda: sorted(p for p in os.listdir("/proc") if p.isdigit()))
attempt("list_state", lambda: sorted(os.listdir(spec["state"])))
attempt("read_db", lambda: read(os.path.join(spec["state"], "ops.db")))
attempt("list_other", lambda: sorted(os.listdir(spec["other"])))
attempt("read_other", lambda: read(os.path.join(spec["other"], "secret.txt")))
attempt("list_home", lambda: sorted(os.listdir(spec["home"])))
attempt("list_checkout", lambda: sorted(os.listdir(spec["checkout"])))
attempt("write_state", lambda: write(os.path.join(spec["state"], "pwned")))
attempt("write_other", lambda: write(os.path.join(spec["other"], "pwned")))
attempt("write_outside", lambda: write(spec["outside"]))
attempt("write_beside_itself", lambda: write("out.txt"))
attempt("connect_listener", lambda: connect(spec["port"]))
attempt("connect_redis", lambda: connect(6379))
import helper  # would leave helper's bytecode in the tree, were bytecode written there
attempt("dont_write_bytecode", lambda: sys.flags.dont_write_bytecode)
print(json.dumps(found))
json.dump(found, open(os.environ["AUTOPILOT_RESULT"], "w"))
"""


@dataclass
class Scene:
    state: Path  # a state dir as a GPU host has one
    other: Path  # another job's export in it
    export: Path  # this job's export (its cwd)
    outside: Path
    canary: str


@pytest.fixture
def scene(outside: Path, canary: str, monkeypatch: pytest.MonkeyPatch) -> Scene:
    """Under `outside` (not /tmp, the sandbox's own tmpfs, where a write that escaped would
    stay hidden from the host)."""
    state = outside / "state"
    other = state / "jobs" / "7" / "src"
    export = state / "jobs" / "8" / "src"
    for folder in (other, export):
        folder.mkdir(parents=True)
    (state / "ops.db").write_text("SECRET-DB-CONTENT")
    (other / "secret.txt").write_text("OTHER-JOB-SECRET")
    (export / "helper.py").write_text("VALUE = 1\n")
    # The worker holds a secret in its environment: the experiment must find it nowhere.
    monkeypatch.setenv("AUTOPILOT_CANARY_SECRET", canary)
    return Scene(state, other, export, outside / "outside.txt", canary)


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server of the host on 127.0.0.1 (accepts, nothing more)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield int(server.getsockname()[1])


def job_in(scene: Scene, venv: Venv, runtime: RuntimeDir, body: str, **kw: Any) -> LaunchSpec:
    (scene.export / "exp.py").write_text(textwrap.dedent(body))
    args: dict[str, Any] = {
        "venv": venv.path,
        "entry": "exp",
        "cwd": scene.export,
        "runtime": runtime,
        "spec": {},
        "pythonpath": [scene.export],
        "base_env": dict(os.environ),
        "cuda_visible_devices": "",
        "sandboxed": True,
        "cgroup": f"job-test-{os.getpid()}",
    }
    args.update(kw)
    return LaunchSpec(**args)


def _base_install_in_home() -> set[str]:
    base, home = Path(sys.base_prefix).resolve(), Path(os.path.expanduser("~"))
    return {base.relative_to(home).parts[0]} if base.is_relative_to(home) else set()


def _inherited_in(root: Path, venv: Venv) -> set[str]:
    """The first path part under `root` of each site dir the venv inherits (bound read-only)."""
    dirs = [Path(d) for d in inherited_site_dirs(venv.path)]
    return {d.relative_to(root).parts[0] for d in dirs if d.is_relative_to(root)}


def files_under(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("*") if p.is_file()]


@pytest.mark.parametrize("network", [False, True], ids=["no-network", "network"])
def test_a_hostile_experiment_reaches_nothing_but_its_own_dirs(
    scene: Scene, venv: Venv, runtime_dir: RuntimeDir, listener: int, network: bool
) -> None:
    spec = {
        "params": {
            "state": str(scene.state),
            "other": str(scene.other),
            "outside": str(scene.outside),
            "home": os.path.expanduser("~"),
            "checkout": str(CHECKOUT),
            "port": listener,
        }
    }
    job = job_in(scene, venv, runtime_dir, HOSTILE, spec=spec, network=network)
    outcome = run_job(job)
    assert outcome.ok, outcome.stderr  # it settles with its result
    found = outcome.result

    # The worker's environment: not through /proc (its pid 1 is bwrap, started with none), not
    # in its own; the canary is nowhere the experiment could write.
    assert "AUTOPILOT_CANARY_SECRET" not in found["environ_own"]["value"]
    for where in ("environ_parent", "environ_init"):
        assert not found[where]["ok"] or found[where]["value"] == "", found[where]
    assert len(found["processes"]["value"]) <= 3  # bwrap's init, the job; no host process
    written = [outcome.stdout, outcome.stderr, json.dumps(found)]
    written += [
        p.read_text(errors="replace") for p in files_under(scene.export, runtime_dir.target)
    ]
    assert not [text for text in written if scene.canary in text]

    # The state dir, another job's export, the service's home and checkout: not there.
    assert "ops.db" not in found["list_state"].get("value", [])
    for name in ("read_db", "list_other", "read_other"):
        assert not found[name]["ok"], (name, found[name])
    # Of the checkout, at most the way to the service's venv whose packages the job's venv
    # inherits (bound read-only; CI's checkout holds its .venv).
    assert set(found["list_checkout"].get("value", [])) <= _inherited_in(CHECKOUT, venv)
    # Of the home, at most the way to the base interpreter's install (bound read-only).
    assert set(found["list_home"].get("value", [])) <= _base_install_in_home()
    assert "SECRET" not in json.dumps(found)
    # Writes past its dirs land nowhere on the host; beside itself they do (a throwaway copy).
    assert not (scene.state / "pwned").exists() and not (scene.other / "pwned").exists()
    assert not scene.outside.exists()
    assert (scene.export / "out.txt").read_text() == "pwned"

    # The network: the host's only when the experiment's config asks for it.
    assert found["connect_listener"]["ok"] is network, found["connect_listener"]
    if not network:
        assert not found["connect_redis"]["ok"]

    # Bytecode: none written, none in the tree.
    assert found["dont_write_bytecode"]["value"] == 1
    assert not [p for p in scene.export.rglob("*") if p.name == "__pycache__" or p.suffix == ".pyc"]


GRANDCHILD = """
import json, os, sys, time

spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))["params"]
if os.fork() == 0:
    os.setsid()  # leaves the job's process group and session
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
            spec["token"]])
    os._exit(0)
while not os.path.exists(spec["go"]):
    time.sleep(0.01)
json.dump({"left": "a daemon"}, open(os.environ["AUTOPILOT_RESULT"], "w"))
"""


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unconfined"])
def test_a_setsid_grandchild_that_ignores_sigterm_goes_with_its_job(
    scene: Scene, venv: Venv, runtime_dir: RuntimeDir, sandboxed: bool
) -> None:
    token = f"ap-daemon-{os.urandom(6).hex()}"
    go = scene.export / "go"
    spec = {"params": {"token": token, "go": str(go)}}
    job = job_in(scene, venv, runtime_dir, GRANDCHILD, spec=spec, sandboxed=sandboxed)
    done: list[Outcome] = []
    # run_job from a thread that lives as long as the job (PR_SET_PDEATHSIG follows it).
    runner = threading.Thread(target=lambda: done.append(run_job(job)))
    runner.start()
    try:
        (daemon,) = wait_for(lambda: living_with(token), timeout=30)
    finally:
        go.write_text("")
        runner.join(timeout=60)
    assert done and done[0].ok, done and done[0].stderr
    # Its job is over: the daemon is gone with the job's cgroup, checked by its host pid.
    wait_for(lambda: not alive(daemon), timeout=10)


def test_a_sandboxed_spare_serves_only_the_export_it_binds(
    scene: Scene, venv: Venv, runtime_dir: RuntimeDir
) -> None:
    body = "import json, os\njson.dump(os.getcwd(), open(os.environ['AUTOPILOT_RESULT'], 'w'))\n"
    job = job_in(scene, venv, runtime_dir, body)

    def spare(**kw: Any) -> Spare:
        args: dict[str, Any] = {
            "venv": venv.path,
            "runtime": runtime_dir,
            "cuda_visible_devices": "",
            "base_env": job.base_env,
            "sandboxed": True,
            "workdir": scene.export,
        }
        return Spare(**{**args, **kw})

    used = run_job(job, spare=spare())
    assert used.ok and used.launch == "spare" and used.result == str(scene.export)

    elsewhere = run_job(job, spare=spare(workdir=scene.other))
    assert elsewhere.ok and elsewhere.launch == "cold"
    assert elsewhere.spare_missed is not None and "another export" in elsewhere.spare_missed

    networked = run_job(job, spare=spare(network=True))
    assert networked.launch == "cold" and networked.spare_missed == "another network setting"

    unconfined = run_job(job, spare=spare(sandboxed=False, workdir=None))
    assert unconfined.launch == "cold"
    assert unconfined.spare_missed == "the sandbox setting differs"
