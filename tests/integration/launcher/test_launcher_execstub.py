"""The exec stub (`workers/launcher/execstub.py`): a cold job exec'd by the worker's waiting stub
runs in the stub's cgroup from its first instruction, with exactly the job's environment; the
stub never outlives its worker, and an unused one is gone, with its cgroup, at shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.sandbox import cgroups, confined
from app.sandbox.exceptions import SandboxUnavailable
from tests.integration.launcher.conftest import MakeJob
from tests.support import alive, wait_for
from workers.launcher import confine, execstub, staging
from workers.launcher.launch import LaunchError
from workers.launcher.runner import Limits, run_job

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="cgroups, pidfds, /proc")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def writable_cgroups() -> Iterator[None]:
    try:
        cgroups.Cgroup.create(f"probe-{os.getpid()}").remove()
    except SandboxUnavailable as exc:
        pytest.skip(f"no writable cgroup v2 here: {exc}")
    yield
    execstub.discard()


def _waiting() -> execstub.ExecStub:
    assert execstub.prepare()
    assert execstub.wait_ready(30)
    stub = execstub._waiting
    assert stub is not None and stub.cgroup is not None
    return stub


#: Its first line reads its own cgroup, then a child it forks reads its own.
FIRST_LINE = """
cgroup = open("/proc/self/cgroup").read()
import json, os, subprocess, sys
child = subprocess.run([sys.executable, "-c", "print(open('/proc/self/cgroup').read())"],
                       capture_output=True, text=True, check=True).stdout
json.dump({"first": cgroup, "child": child}, open(os.environ["AUTOPILOT_RESULT"], "w"))
"""


def test_a_cold_job_runs_in_the_stubs_cgroup_from_its_first_line(make_job: MakeJob) -> None:
    stub = _waiting()
    assert stub.cgroup is not None
    cgroup_path = stub.cgroup.path
    # the stub was moved before it is given any job: the job's process is in its cgroup
    assert stub.proc.pid in stub.cgroup.pids()
    pid = stub.proc.pid
    job = make_job(FIRST_LINE, cgroup=confine.job_cgroup_name(21))
    out = run_job(job, limits=Limits(timeout_s=60))
    assert out.ok, out.stderr
    assert out.launch == "stub" and out.pid == pid
    for seen in (out.result["first"], out.result["child"]):
        line = next(ln for ln in seen.splitlines() if ln.startswith("0::"))
        assert line.endswith(f"/autopilot/{cgroup_path.name}"), line
    assert not cgroup_path.exists()  # the job's cgroup: removed with the job
    # the job's own named cgroup was never made: nothing was moved
    assert not (cgroups.cgroup_base() / confine.job_cgroup_name(21)).exists()


ENVIRON = """
import json, os
raw = open("/proc/self/environ", "rb").read()
env = dict(kv.decode().split("=", 1) for kv in raw.split(b"\\0") if kv)
json.dump(env, open(os.environ["AUTOPILOT_RESULT"], "w"))
"""


def test_the_job_gets_its_environment_and_nothing_else(
    make_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the job was exec'd with (/proc/self/environ) is exactly `job.env()`: none of the
    worker's variables the job env does not list, none the stub's interpreter set (with an empty
    environment CPython coerces the C locale: LC_CTYPE), and the stub itself had none."""
    monkeypatch.setenv("AUTOPILOT_FORGE_TOKEN", "secret-of-the-worker")
    monkeypatch.delenv("LC_ALL", raising=False)
    monkeypatch.delenv("LC_CTYPE", raising=False)
    stub = _waiting()
    assert Path(f"/proc/{stub.proc.pid}/environ").read_bytes() == b""
    job = make_job(ENVIRON, cgroup=confine.job_cgroup_name(22), base_env=dict(os.environ))
    assert "AUTOPILOT_FORGE_TOKEN" not in job.env()
    out = run_job(job, limits=Limits(timeout_s=60))
    assert out.ok and out.launch == "stub", out.stderr
    assert out.result == job.env()


def test_the_stub_restores_the_signals_python_ignores(tmp_path: Path) -> None:
    """An exec keeps ignored signals ignored: the stub resets what CPython ignores (SIGPIPE,
    SIGXFSZ), as subprocess does for a child, so the job starts as a spawned one would."""
    argv = ["/bin/grep", "^SigIgn", "/proc/self/status"]
    spawned = subprocess.run(argv, capture_output=True, check=True).stdout  # noqa: S603
    stub = _waiting()
    execstub.take()
    proc = stub.launch(argv, {}, tmp_path)
    assert proc is not None
    out, _ = proc.communicate(timeout=30)
    assert out == spawned
    assert stub.cgroup is not None
    stub.cgroup.remove()


@pytest.mark.parametrize(
    ("cwd", "refusal"),
    [
        (Path("/nonexistent/wt"), "No such file or directory"),  # the exec fails in the stub
        (Path("/tmp/a\0b"), "NUL"),  # the worker refuses it before the stub sees it
    ],
)
def test_a_refused_launch_is_a_launch_error_and_leaves_nothing(
    make_job: MakeJob, cwd: Path, refusal: str
) -> None:
    stub = _waiting()
    assert stub.cgroup is not None
    pid, path = stub.proc.pid, stub.cgroup.path
    job = make_job("pass\n", cgroup=confine.job_cgroup_name(23), cwd=cwd)
    with pytest.raises(LaunchError, match=refusal):
        run_job(job, limits=Limits(timeout_s=30))
    assert not alive(pid)
    assert not path.exists()


def test_a_dead_stub_falls_back_to_the_placed_start(make_job: MakeJob) -> None:
    stub = _waiting()
    stub.proc.kill()
    stub.proc.wait()
    job = make_job(FIRST_LINE, cgroup=confine.job_cgroup_name(24))
    out = run_job(job, limits=Limits(timeout_s=60))
    assert out.ok and out.launch == "cold", out.stderr
    assert out.result["first"].strip().endswith(confine.job_cgroup_name(24))


def test_a_sandboxed_job_keeps_its_path_and_leaves_the_stub(make_job: MakeJob) -> None:
    if why := confined.check():
        pytest.skip(f"no sandbox here: {why}")
    stub = _waiting()
    job = make_job("pass\n", cgroup=confine.job_cgroup_name(25), sandboxed=True)
    out = run_job(job, limits=Limits(timeout_s=60, read_result=False))
    assert out.returncode == 0 and out.launch == "cold", out.stderr
    assert execstub._waiting is stub and stub.alive()  # still waiting for a job it can run


def test_an_unused_stub_is_gone_with_its_cgroup_at_shutdown() -> None:
    from workers import tasks

    stub = _waiting()
    assert stub.cgroup is not None
    pid, path = stub.proc.pid, stub.cgroup.path
    assert path.name.startswith("stub-") and path.name.endswith(confine.owner_suffix())
    tasks._close_spare()  # the GPU worker's worker_shutdown handler
    assert not alive(pid)
    assert not path.exists()
    assert execstub._waiting is None


WORKER = """
import sys, time
from workers.launcher import execstub
assert execstub.prepare() and execstub.wait_ready(30)
stub = execstub._waiting
print(stub.proc.pid, stub.cgroup.path, flush=True)
time.sleep(600)
"""


def test_the_stub_dies_with_its_worker() -> None:
    """SIGKILL the worker: its death watch kills and removes the stub's cgroup."""
    worker = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", WORKER],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert worker.stdout is not None
        pid_text, path_text = worker.stdout.readline().split()
        pid, path = int(pid_text), Path(path_text)
        assert alive(pid) and pid in cgroups.Cgroup(path).pids()
        assert path.name.endswith(f".w{worker.pid}")
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    wait_for(lambda: not alive(pid), timeout=10)
    wait_for(lambda: not path.exists(), timeout=10)  # the death watch removed it


def test_the_orphan_sweep_removes_a_dead_workers_stub_cgroup() -> None:
    gone = subprocess.Popen(["/bin/true"])  # noqa: S603 - a pid that no longer runs
    gone.wait()
    left = cgroups.Cgroup.create(f"stub-1.w{gone.pid}")
    sleeper = subprocess.Popen(["/bin/sleep", "600"])  # noqa: S603
    try:
        left.add(sleeper.pid)
        confine.sweep_orphans()
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert not left.path.exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        left.remove()


def test_a_job_message_with_a_nul_is_refused() -> None:
    stub = _waiting()
    execstub.take()
    try:
        with pytest.raises(LaunchError, match="NUL"):
            stub.launch(["/bin/true", "a\0b"], {}, Path("/"))
        assert stub.alive()  # nothing was sent: the caller still owns it
    finally:
        stub.close()


def test_a_launch_larger_than_the_pipe_reaches_the_job_whole(tmp_path: Path) -> None:
    """The stub reads its launch to the length it was told: an environment over the pipe's
    64 KiB arrives whole (and one cut short would not run)."""
    stub = _waiting()
    execstub.take()
    big = {"BIG": "x" * 100_000, "OTHER": "y" * 30_000}
    proc = stub.launch(["/bin/sh", "-c", 'printf "%s %s" "${#BIG}" "${#OTHER}"'], big, tmp_path)
    assert proc is not None
    out, _ = proc.communicate(timeout=30)
    assert out == b"100000 30000"
    assert stub.cgroup is not None
    stub.cgroup.remove()


def test_a_relative_cwd_means_what_it_means_to_popen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "wt").mkdir()
    monkeypatch.chdir(tmp_path)
    stub = _waiting()
    execstub.take()
    proc = stub.launch(["/bin/pwd"], {}, Path("wt"))
    assert proc is not None
    out, _ = proc.communicate(timeout=30)
    assert out.decode().strip() == str(tmp_path / "wt")
    assert stub.cgroup is not None
    stub.cgroup.remove()


def test_a_start_again_after_the_stub_refused_runs_in_the_jobs_cgroup(make_job: MakeJob) -> None:
    """The worker starts a staged job again after a start that failed (a transient error): the
    stub was used up by the first try, so the second must open the job's own cgroup, never run
    the job without one."""
    _waiting()
    job = make_job(FIRST_LINE, cgroup=confine.job_cgroup_name(26))
    away = job.cwd.with_name("wt-away")
    staged = staging.stage(job)
    assert staged.stub is not None and staged.cgroup is None
    job.cwd.rename(away)  # the stub's chdir fails once
    with pytest.raises(LaunchError):
        staged.go()
    away.rename(job.cwd)
    out = run_job(job, staged=staged, limits=Limits(timeout_s=60))
    assert out.ok and out.launch == "cold", out.stderr
    for seen in (out.result["first"], out.result["child"]):
        assert seen.strip().endswith(confine.job_cgroup_name(26)), seen


def test_a_stuck_stub_is_killed_and_the_job_starts_placed(
    make_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(execstub, "EXEC_TIMEOUT_S", 1.0)
    stub = _waiting()
    pid = stub.proc.pid
    os.kill(pid, signal.SIGSTOP)  # it never takes its job
    job = make_job(FIRST_LINE, cgroup=confine.job_cgroup_name(27))
    out = run_job(job, limits=Limits(timeout_s=60))
    assert out.ok and out.launch == "cold", out.stderr
    assert out.result["first"].strip().endswith(confine.job_cgroup_name(27))
    assert not alive(pid)
