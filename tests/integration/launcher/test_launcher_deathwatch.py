"""A job never outlives its worker, with no preexec_fn on the cold path: the worker's death
watch kills its cgroups when the worker dies (cold and parked launches, sandbox on and off),
and a cold module job is spawned with vfork and placed in its cgroup before any of its code."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from app.sandbox import cgroups, confined
from app.sandbox.exceptions import SandboxUnavailable
from tests.support import alive, wait_for
from workers.launcher import confine, deathwatch, launch
from workers.launcher.launch import LaunchSpec
from workers.launcher.runner import Limits, run_job
from workers.launcher.venv import Venv

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="cgroups, pidfds, /proc")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def writable_cgroups() -> None:
    try:
        cgroups.Cgroup.create(f"probe-{os.getpid()}").remove()
    except SandboxUnavailable as exc:
        pytest.skip(f"no writable cgroup v2 here: {exc}")


#: A job that starts a grandchild which leaves its session, says so if its worker still
#: listens, and sleeps: nothing of it ends unless it is killed.
ESCAPER = """
import json, os, socket, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"])
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["AUTOPILOT_EVENTS"])
    s.sendall(json.dumps({"type": "log", "message": "escaped"}).encode() + b"\\n")
except OSError:
    pass
time.sleep(600)
"""

WORKER = """
import os, sys
from pathlib import Path
from workers.launcher import confine, execstub, runner
from workers.launcher.launch import LaunchSpec
from workers.launcher.runtime import allocate_runtime
from workers.launcher.spare import Spare
state, short, venv, how, sandboxed = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4], sys.argv[5] == "on"
rt = allocate_runtime(state_dir=state, env={}, roots=[("given", short)])
wt = state / "wt"
name = confine.job_cgroup_name(1)
common = dict(venv=venv, runtime=rt, base_env=dict(os.environ), cuda_visible_devices="",
              sandboxed=sandboxed)
spare = None
if how == "spare":
    spare = Spare(workdir=wt, cgroup_name=name, **common)
    assert spare.wait_ready(60) is None
if how == "stub":  # a cold start exec'd by the worker's stub, in the stub's cgroup
    assert execstub.prepare() and execstub.wait_ready(60)
job = LaunchSpec(entry="exp", cwd=wt, spec={}, pythonpath=[wt], cgroup=name, **common)
say = lambda *words: print(*words, flush=True)
def spawned(pid, _group):
    own = [ln for ln in open(f"/proc/{pid}/cgroup").read().splitlines() if ln[:3] == "0::"]
    say("spawned", pid, Path(own[0][3:]).name)
runner.run_job(job, spare=spare, on_spawn=spawned, on_event=lambda e: say("event"))
"""


def _worker(tmp_path: Path, venv: Venv, how: str, sandboxed: bool) -> subprocess.Popen[str]:
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / "exp.py").write_text(ESCAPER)
    short = tempfile.mkdtemp(prefix="apd-", dir="/tmp")  # noqa: S108 - a killed worker leaves it
    args = [str(tmp_path), short, str(venv.path), how, "on" if sandboxed else "off"]
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", WORKER, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize("when", ["at-spawn", "mid-job"])
@pytest.mark.parametrize("how", ["cold", "spare", "stub"])
@pytest.mark.parametrize("sandboxed", [False, True], ids=["unconfined", "sandboxed"])
def test_the_job_dies_with_its_worker(
    tmp_path: Path, venv: Venv, how: str, sandboxed: bool, when: str
) -> None:
    if sandboxed and (why := confined.check()):
        pytest.skip(f"no sandbox here: {why}")
    if sandboxed and how == "stub":
        pytest.skip("a sandboxed job takes no exec stub (test_launcher_execstub.py)")
    worker = _worker(tmp_path, venv, how, sandboxed)
    try:
        assert worker.stdout is not None
        _, pid, name = worker.stdout.readline().split()
        # The job's cgroup, named for its worker: the stub's, else the one named for the job.
        if how == "stub":
            assert name.startswith("stub-") and name.endswith(f".w{worker.pid}"), name
        else:
            assert name == f"job-1.w{worker.pid}"
        cgroup = cgroups.Cgroup(cgroups.cgroup_base() / name)
        # Placed before it runs anything: the spawned process is in its job's cgroup already.
        assert int(pid) in cgroup.pids()
        if when == "mid-job":
            assert worker.stdout.readline().strip() == "event"
            # the job and the grandchild that left its session (and bwrap's, sandboxed)
            assert len(cgroup.pids()) >= 2
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    wait_for(lambda: not alive(int(pid)), timeout=10)
    wait_for(lambda: not cgroup.populated(), timeout=10)
    wait_for(lambda: not cgroup.path.exists(), timeout=10)  # the death watch removed it


def test_a_cold_module_job_is_spawned_with_vfork(
    tmp_path: Path, venv: Venv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No preexec_fn on the cold path: CPython then uses vfork (checked with strace when
    there is one); a cgroup the death watch does not cover keeps the preexec (fork)."""
    seen: list[tuple[list[str], dict[str, Any]]] = []
    real = subprocess.Popen

    def recording(argv: list[str], **kw: Any) -> Any:
        seen.append((argv, kw))
        return real(argv, **kw)

    monkeypatch.setattr(launch.subprocess, "Popen", recording)
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / "exp.py").write_text("import os, sys\nprint(os.getppid(), flush=True)\n")
    from workers.launcher.runtime import allocate_runtime, release_runtime

    rt = allocate_runtime(state_dir=tmp_path, env=os.environ)
    try:
        for name, preexec in ((confine.job_cgroup_name(7), False), (f"t-{os.getpid()}", True)):
            seen.clear()
            job = LaunchSpec(
                venv=venv.path,
                entry="exp",
                cwd=tmp_path / "wt",
                runtime=rt,
                spec={},
                pythonpath=[tmp_path / "wt"],
                base_env=dict(os.environ),
                cuda_visible_devices="",
                cgroup=name,
            )
            out = run_job(job, limits=Limits(timeout_s=30, read_result=False))
            assert out.returncode == 0, out.stderr
            [job_popen] = [kw for argv, kw in seen if argv[0] == str(venv.python)]
            assert (job_popen.get("preexec_fn") is not None) is preexec, name
    finally:
        release_runtime(rt)


STRACED = """
import os, sys
from pathlib import Path
from workers.launcher import confine
from workers.launcher.launch import LaunchSpec
from workers.launcher.runner import Limits, run_job
from workers.launcher.runtime import allocate_runtime
state, venv, owned = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "owned"
rt = allocate_runtime(state_dir=state, env={})
name = confine.job_cgroup_name(3) if owned else f"t-{os.getpid()}"
job = LaunchSpec(venv=venv, entry="exp", cwd=state / "wt", runtime=rt, spec={},
                 pythonpath=[state / "wt"], base_env=dict(os.environ), cgroup=name)
from app.sandbox import cgroups
from workers.launcher import deathwatch
# The first job would start the death watch (with vfork too): started before the mark.
deathwatch.ensure(cgroups.cgroup_base(), confine.owner_suffix())
os.write(2, b"SPAWN\\n")
out = run_job(job, limits=Limits(timeout_s=30, read_result=False))
assert out.returncode == 0, out.stderr
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="no strace")
@pytest.mark.parametrize("owned", [True, False], ids=["watched-cgroup", "other-cgroup"])
def test_strace_shows_vfork_for_a_cold_job(tmp_path: Path, venv: Venv, owned: bool) -> None:
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / "exp.py").write_text("pass\n")
    trace = tmp_path / "trace"
    done = subprocess.run(  # noqa: S603
        ["strace", "-f", "-o", str(trace), "-e", "trace=vfork,clone,clone3,fork,write"]
        + ["-e", "signal=none", sys.executable, "-c", STRACED, str(tmp_path), str(venv.path)]
        + ["owned" if owned else "other"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    if done.returncode != 0 and "ptrace" in done.stderr.lower():
        pytest.skip(f"strace cannot trace here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    after = trace.read_text().split('"SPAWN\\n"', 1)[1]
    forks = [
        line
        for line in after.splitlines()
        if ("clone(" in line or "clone3(" in line) and "CLONE_THREAD" not in line
    ]
    if owned:
        assert "vfork(" in after, after[-3000:]
        assert forks == [], forks  # no process of ours was started with fork
    else:
        assert forks, after[-3000:]  # the preexec_fn path: fork, as before


def test_a_placed_job_runs_nothing_when_its_worker_died_first(tmp_path: Path, venv: Venv) -> None:
    """The worker died after the spawn but before it moved the job into its cgroup: the
    pipe's end of file makes the job exit before any of its code runs."""
    marker = tmp_path / "ran"
    (tmp_path / "exp.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    go, ready = os.pipe()
    proc = subprocess.Popen(  # noqa: S603
        [str(venv.python), "-c", launch._PLACED, str(go), "exp"],
        cwd=tmp_path,
        env={"PYTHONSAFEPATH": "1", "PYTHONPATH": str(tmp_path)},
        pass_fds=(go,),
    )
    os.close(go)
    os.close(ready)  # as the kernel does when the worker dies
    assert proc.wait(timeout=30) == 125
    assert not marker.exists()


PROBE = """
import json, os, sys
g = dict(globals())
json.dump({"argv": sys.argv, "name": __name__, "spec": __spec__.name, "file": __file__,
           "path": sys.path, "main_globals": sorted(g), "safe_path": sys.flags.safe_path,
           "modules": sorted(m for m in sys.modules if not m.startswith("_"))},
          open(os.environ["AUTOPILOT_RESULT"], "w"))
"""


def test_a_placed_job_sees_what_python_m_shows(tmp_path: Path, venv: Venv) -> None:
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / "exp.py").write_text(PROBE)
    from workers.launcher.runtime import allocate_runtime, release_runtime

    rt = allocate_runtime(state_dir=tmp_path, env=os.environ)
    try:
        job = LaunchSpec(
            venv=venv.path,
            entry="exp",
            cwd=tmp_path / "wt",
            runtime=rt,
            spec={},
            pythonpath=[tmp_path / "wt"],
            base_env=dict(os.environ),
            cuda_visible_devices="",
            cgroup=confine.job_cgroup_name(9),
        )
        placed = run_job(job, limits=Limits(timeout_s=30))
        assert placed.ok, placed.stderr
        env = {**job.env(), "AUTOPILOT_RESULT": str(tmp_path / "m.json")}
        subprocess.run(  # noqa: S603
            [str(venv.python), "-m", "exp"], cwd=tmp_path / "wt", env=env, check=True
        )
        imports = "import json, sys; print(json.dumps(sorted(sys.modules)))"
        runpy_imports = set(_modules(venv, "import runpy; " + imports)) - set(
            _modules(venv, imports)
        )
    finally:
        release_runtime(rt)
    plain = json.loads((tmp_path / "m.json").read_text())
    modules, plain_modules = set(placed.result.pop("modules")), set(plain.pop("modules"))
    assert placed.result == plain
    # The one difference: what runpy itself imports is not imported behind the module's back
    # (`launch.AS_MAIN`, issue 18), as for a script.
    assert "runpy" in plain_modules - modules
    assert modules <= plain_modules and plain_modules - modules <= runpy_imports


def _modules(venv: Venv, code: str) -> list[str]:
    out = subprocess.run(  # noqa: S603
        [str(venv.python), "-I", "-c", code], capture_output=True, text=True, check=True
    )
    return [m for m in json.loads(out.stdout) if not m.startswith("_")]


def test_a_dead_death_watch_is_started_again(tmp_path: Path) -> None:
    base = cgroups.Cgroup.create(f"watch-{os.getpid()}").path
    base.rmdir()
    base.mkdir()
    try:
        assert deathwatch.ensure(base, ".wtest")
        first = deathwatch._current
        assert first is not None
        first.proc.kill()
        first.proc.wait()
        assert deathwatch.ensure(base, ".wtest")
        assert deathwatch._current is not None
        assert deathwatch._current.proc.pid != first.proc.pid
    finally:
        if deathwatch._current is not None:
            deathwatch._current.proc.kill()
            deathwatch._current.proc.wait()
            deathwatch._current = None
        base.rmdir()
