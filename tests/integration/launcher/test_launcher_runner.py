"""The process runner with real experiment processes, real sockets and real signals."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workers.launcher.launch import LaunchError, LaunchSpec
from workers.launcher.runner import Limits, run_job

MakeJob = Callable[..., LaunchSpec]


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def process_gone(pid: int) -> bool:
    """True once `pid` is dead (a zombie waiting for a reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


SEND = """
import json, os, socket
_s = socket.socket(socket.AF_UNIX)
_s.connect(os.environ["AUTOPILOT_EVENTS"])
def send(ev):
    _s.sendall((json.dumps(ev) + "\\n").encode())
def result(obj):
    with open(os.environ["AUTOPILOT_RESULT"], "w") as f:
        json.dump(obj, f)
"""


def test_events_result_and_environment(make_job: MakeJob) -> None:
    job = make_job(
        SEND
        + """
send({"type": "started"})
send({"type": "progress", "done": 1, "total": 2})
_s.sendall(b"not json\\n" + b'{"no_type": 1}\\n')
send({"type": "log", "message": "hi"})
spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))
print("to stdout")
result({"spec": spec, "env": dict(os.environ), "cwd": os.getcwd()})
""",
        base_env={
            **os.environ,
            "GITHUB_TOKEN": "ghp_x",
            "AUTOPILOT_GITHUB_TOKEN": "ghp_y",
            "AUTOPILOT_OPS_URL": "postgresql://u:pw@h/db",
            "LD_PRELOAD": "",
            "PYTHONSTARTUP": "/nonexistent.py",
            "BASH_ENV": "/x",
            "GIT_SSH_COMMAND": "x",
            "MY_SECRET": "s",
        },
        cuda_visible_devices="3",
    )
    seen: list[dict[str, Any]] = []
    spawned: list[tuple[int, int]] = []
    out = run_job(
        job,
        limits=Limits(timeout_s=30),
        on_event=seen.append,
        on_spawn=lambda pid, pgid: spawned.append((pid, pgid)),
    )
    assert out.ok, (out.result_error, out.stderr)
    assert [e["type"] for e in out.events] == ["started", "progress", "log"]
    assert seen == out.events
    assert out.events_malformed == 2
    assert spawned == [(out.pid, out.pgid)]
    assert out.pid == out.pgid  # its own process group
    assert out.stdout == "to stdout\n"
    assert out.result["spec"] == {"params": {"n": 1}}
    env = out.result["env"]
    for secret in (
        "GITHUB_TOKEN",
        "AUTOPILOT_GITHUB_TOKEN",
        "AUTOPILOT_OPS_URL",
        "LD_PRELOAD",
        "PYTHONSTARTUP",
        "BASH_ENV",
        "GIT_SSH_COMMAND",
        "MY_SECRET",
    ):
        assert secret not in env
    assert env["PYTHONSAFEPATH"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["TMPDIR"] == str(job.runtime.path)
    assert env["AUTOPILOT_EVENTS"] == str(job.runtime.events_path)
    assert out.result["cwd"] == str(job.cwd)
    assert not job.runtime.events_path.exists()  # the runner cleans its socket


def test_the_entry_is_the_worktree_module_not_a_cwd_copy(make_job: MakeJob, tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "exp.py").write_text("raise SystemExit('shadow module ran')\n")
    job = make_job(SEND + "result({'who': 'worktree'})\n", cwd=cwd)
    out = run_job(job, limits=Limits(timeout_s=30))
    assert out.ok, out.stderr
    assert out.result == {"who": "worktree"}


IDENTITY = (
    SEND
    + """
import sys
main = sys.modules["__main__"]
result({"name": __name__, "file": __file__, "argv": sys.argv, "path": sys.path,
        "spec": [__spec__.name, __spec__.origin, __spec__.cached, __spec__.parent],
        "package": __package__, "loader": type(__loader__).__name__, "doc": __doc__,
        "globals": sorted(globals()), "main_is_me": main.__dict__ is globals(),
        "runpy": "runpy" in sys.modules})
"""
)


@pytest.mark.parametrize("layout", ["module", "package"])
def test_the_entry_runs_as_dash_m_runs_it(make_job: MakeJob, layout: str) -> None:
    """A cold start runs the module as `python -m exp` does, without importing runpy for a
    top-level module (issue 18: ~2 ms of the start); a package's `__main__` takes runpy's own
    path. Compared field by field with the real `python -m`, in the job's environment."""
    job = make_job(IDENTITY)
    entry = "exp"
    if layout == "package":
        (job.cwd / "pk").mkdir()
        (job.cwd / "pk" / "__init__.py").write_text("")
        (job.cwd / "pk" / "__main__.py").write_text((job.cwd / "exp.py").read_text())
        entry = "pk"
    job = make_job(IDENTITY, entry=entry)
    ours = run_job(job, limits=Limits(timeout_s=30))
    assert ours.ok, ours.stderr
    env = job.env()
    env["AUTOPILOT_RESULT"] = str(job.runtime.path / "plain.json")
    with socket.socket(socket.AF_UNIX) as listener:  # the module connects to its events socket
        job.runtime.events_path.unlink(missing_ok=True)
        listener.bind(str(job.runtime.events_path))
        listener.listen(1)
        subprocess.run([str(job.python), "-m", entry], cwd=job.cwd, env=env, check=True)
    plain = json.loads((job.runtime.path / "plain.json").read_text())
    job.runtime.events_path.unlink()
    assert ours.result["runpy"] is (layout == "package")
    assert plain["runpy"]
    for key in set(plain) - {"runpy"}:
        assert ours.result[key] == plain[key], key
    assert ours.result["name"] == "__main__" and ours.result["main_is_me"]
    assert ours.result["argv"] == [ours.result["file"]]
    assert ours.result["path"][0] == str(job.cwd)  # PYTHONPATH first, no script folder


def test_an_entry_that_does_not_exist_fails_as_dash_m_does(make_job: MakeJob) -> None:
    out = run_job(make_job("pass\n", entry="no_such_module"), limits=Limits(timeout_s=30))
    assert out.returncode == 1
    assert "No module named no_such_module" in out.stderr


def test_timeout_kills_the_group_including_a_grandchild_that_ignores_sigterm(
    make_job: MakeJob,
) -> None:
    job = make_job(
        SEND
        + """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
g = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
send({"type": "log", "grandchild": g.pid})
time.sleep(600)
"""
    )
    pids: list[int] = []
    out = run_job(
        job,
        limits=Limits(timeout_s=1.5, grace_s=0.5),
        on_event=lambda e: pids.append(e["grandchild"]),
    )
    assert out.timed_out
    assert out.signal == "SIGKILL"
    assert out.result_error is not None and "timed out" in out.result_error
    assert len(pids) == 1
    wait_for(lambda: process_gone(pids[0]), timeout=5, what="the grandchild to die")


def test_a_background_grandchild_does_not_outlive_a_finished_job(make_job: MakeJob) -> None:
    job = make_job(
        SEND
        + """
import subprocess, sys
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
send({"type": "log", "grandchild": g.pid})
result({})
"""
    )
    pids: list[int] = []
    out = run_job(job, limits=Limits(timeout_s=30), on_event=lambda e: pids.append(e["grandchild"]))
    assert out.ok, out.stderr
    assert out.duration_s < 20
    wait_for(lambda: process_gone(pids[0]), timeout=5, what="the grandchild to die")


def test_a_flood_on_stdout_is_capped_and_killed(make_job: MakeJob) -> None:
    job = make_job("""
import sys
chunk = "y" * 65536
while True:
    sys.stdout.write(chunk)
""")
    out = run_job(job, limits=Limits(timeout_s=1.0, grace_s=0.5, max_output_bytes=4096))
    assert out.timed_out
    assert len(out.stdout) == 4096
    assert out.stdout_bytes > 1_000_000


def test_missing_and_invalid_results_are_clear_errors(make_job: MakeJob) -> None:
    out = run_job(make_job("pass\n"), limits=Limits(timeout_s=30))
    assert out.returncode == 0
    assert not out.ok
    assert "wrote no result" in (out.result_error or "")
    bad = make_job("import os\nopen(os.environ['AUTOPILOT_RESULT'], 'w').write('{nope')\n")
    out = run_job(bad, limits=Limits(timeout_s=30))
    assert "not valid JSON" in (out.result_error or "")


def test_a_crash_reports_its_exit_code_and_stderr(make_job: MakeJob) -> None:
    out = run_job(make_job("raise RuntimeError('boom')\n"), limits=Limits(timeout_s=30))
    assert out.returncode == 1
    assert "RuntimeError: boom" in out.stderr


def test_event_caps(make_job: MakeJob) -> None:
    job = make_job(
        SEND
        + """
for i in range(50):
    send({"type": "sample", "i": i})
_s.sendall(b'{"type": "log", "message": "' + b"z" * 5000 + b'"}\\n')
send({"type": "log", "message": "after"})
result({})
"""
    )
    count = [0]

    def on_event(_e: dict[str, Any]) -> None:
        count[0] += 1

    out = run_job(
        job, limits=Limits(timeout_s=30, max_events=10, max_event_bytes=1024), on_event=on_event
    )
    assert len(out.events) == 10
    assert out.events_dropped == 41
    assert count[0] == 51  # the callback still sees every event (heartbeats)
    assert out.events_malformed == 1  # the oversized line


def test_a_callback_error_stops_the_job(make_job: MakeJob) -> None:
    job = make_job(SEND + "import time\nsend({'type': 'started'})\ntime.sleep(600)\n")
    pgids: list[int] = []

    def on_event(_e: dict[str, Any]) -> None:
        raise KeyError("lease lost")

    with pytest.raises(KeyError):
        run_job(
            job,
            limits=Limits(timeout_s=60),
            on_event=on_event,
            on_spawn=lambda _p, g: pgids.append(g),
        )
    wait_for(lambda: process_gone(pgids[0]), timeout=5, what="the job to die")


def test_bad_entry_is_refused(make_job: MakeJob) -> None:
    with pytest.raises(LaunchError, match="dotted module name"):
        run_job(make_job("pass\n", entry="-c"), limits=Limits(timeout_s=5))


WORKER = """
import json, os, sys
from pathlib import Path
import workers.launcher.runner as runner
from workers.launcher.launch import LaunchSpec
from workers.launcher.runtime import allocate_runtime
rt = allocate_runtime(state_dir=Path(sys.argv[1]), env={}, roots=[("given", sys.argv[2])])
wt = Path(sys.argv[1]) / "wt"
job = LaunchSpec(venv=Path(sys.argv[3]), entry="exp", cwd=wt, runtime=rt, spec={},
                 pythonpath=[wt], base_env=dict(os.environ))
runner.run_job(job, on_event=lambda e: print(e["pid"], flush=True))
"""


def test_the_job_dies_with_its_worker(tmp_path: Path, venv: Any) -> None:
    import shutil
    import subprocess
    import sys
    import tempfile

    short = tempfile.mkdtemp(prefix="apw-", dir="/tmp")  # the killed worker cannot clean up
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / "exp.py").write_text(
        SEND + "import time\nsend({'type': 'log', 'pid': os.getpid()})\ntime.sleep(600)\n"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(tmp_path), short, str(venv.path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        job_pid = int(worker.stdout.readline())
        assert not process_gone(job_pid)
    finally:
        worker.kill()
        worker.wait()
    try:
        wait_for(lambda: process_gone(job_pid), timeout=5, what="the job to die with its worker")
    finally:
        shutil.rmtree(short, ignore_errors=True)
