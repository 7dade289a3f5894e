"""Parked interpreters (`Spare`): a job handed to one sees exactly what a cold `-m` start sees."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import living_with
from workers.launcher.launch import LaunchError, LaunchSpec
from workers.launcher.runner import Limits, run_job
from workers.launcher.runtime import RuntimeDir
from workers.launcher.spare import Spare
from workers.launcher.venv import Venv

MakeJob = Callable[..., LaunchSpec]

#: What the entry module reports about the process it finds itself in.
INTROSPECT = """
import json, os, sys
g = {k for k in globals() if not k.startswith("__")}
with open(os.environ["AUTOPILOT_RESULT"], "w") as f:
    json.dump(
        {
            "name": __name__,
            "argv": sys.argv,
            "file": __file__,
            "spec": __spec__.name if __spec__ else None,
            "cwd": os.getcwd(),
            "path0": sys.path[0],
            "path": sys.path,
            "prefix": sys.prefix,
            "env": dict(os.environ),
            "stdin": sys.stdin.read(),
            "main_globals": sorted(g),
            "tmp": __import__("tempfile").gettempdir(),
            "pgid_is_pid": os.getpgid(0) == os.getpid(),
            "safe_path": sys.flags.safe_path,
        },
        f,
    )
"""


@pytest.fixture(params=[False, True], ids=["unconfined", "sandboxed"])
def make_job(request: pytest.FixtureRequest, make_job: MakeJob) -> MakeJob:
    """Every spare test runs unconfined and under the sandbox (in a cgroup of its own)."""
    if request.param:
        from app.sandbox import confined

        if why := confined.check():
            pytest.skip(f"no sandbox here: {why}")

    def make(body: str, **kw: Any) -> LaunchSpec:
        kw.setdefault("sandboxed", request.param)
        kw.setdefault("cgroup", f"test-spare-{os.getpid()}")
        return make_job(body, **kw)

    return make


def spare_for(job: LaunchSpec, **kw: Any) -> Spare:
    return Spare(
        venv=job.venv,
        runtime=job.runtime,
        cuda_visible_devices=job.cuda_visible_devices,
        base_env=job.base_env,
        sandboxed=job.sandboxed,
        network=job.network,
        workdir=job.cwd,
        **kw,
    )


def test_a_job_in_a_spare_sees_what_a_cold_start_sees(make_job: MakeJob) -> None:
    job = make_job(INTROSPECT, requirements_hash="abc123")
    cold = run_job(job)
    assert cold.ok, cold.stderr
    assert cold.launch == "cold"

    spare = spare_for(job)
    warm = run_job(job, spare=spare)
    assert warm.ok, warm.stderr
    assert warm.launch == "spare" and warm.spare_missed is None
    assert warm.pid == spare.proc.pid

    a, b = cold.result, warm.result
    for key in ("name", "argv", "file", "spec", "cwd", "path0", "path", "prefix", "stdin", "tmp"):
        assert a[key] == b[key], key
    assert a["env"] == b["env"]
    assert a["name"] == "__main__" and a["argv"] == [a["file"]]
    assert a["path0"] == str(job.cwd)  # PYTHONPATH's entry first, no script dir
    assert b["main_globals"] == a["main_globals"]  # nothing of the parking code is left
    assert b["safe_path"] and b["pgid_is_pid"] == a["pgid_is_pid"]
    # Unconfined it leads its own group; in the sandbox, bwrap's init leads the session.
    assert b["pgid_is_pid"] is not job.sandboxed


def test_a_job_that_does_not_fit_starts_cold_and_the_spare_is_killed(
    make_job: MakeJob, state_dir: Path
) -> None:
    job = make_job(INTROSPECT)
    spare = spare_for(job, extra_env={"OMP_NUM_THREADS": "3"})  # read at start-up: must match
    outcome = run_job(job, spare=spare)
    assert outcome.ok, outcome.stderr
    assert outcome.launch == "cold"
    assert outcome.spare_missed == "OMP_NUM_THREADS differs (read at interpreter start)"
    assert spare.proc.returncode is not None  # killed and reaped
    assert outcome.result["env"].get("OMP_NUM_THREADS") is None


def test_a_dead_spare_is_not_used(make_job: MakeJob) -> None:
    job = make_job(INTROSPECT)
    spare = spare_for(job)
    os.killpg(spare.proc.pid, signal.SIGKILL)
    spare.proc.wait()
    outcome = run_job(job, spare=spare)
    assert outcome.ok, outcome.stderr
    assert outcome.launch == "cold"
    assert outcome.spare_missed is not None and "exited" in outcome.spare_missed


def test_another_venv_starts_cold(
    make_job: MakeJob, state_dir: Path, runtime_dir: RuntimeDir, venv: Venv
) -> None:
    from workers.launcher.venv import ensure_venv

    other = ensure_venv(state_dir, "other", [], system_site_packages=True)
    job = make_job(INTROSPECT)
    spare = Spare(venv=other.path, runtime=runtime_dir, base_env=job.base_env)
    outcome = run_job(job, spare=spare)
    assert outcome.launch == "cold" and outcome.spare_missed == "another venv"
    assert outcome.result["prefix"] == os.path.abspath(venv.path)


def test_a_spare_job_is_killed_on_timeout_and_leaves_nothing(make_job: MakeJob) -> None:
    token = f"ap-grandchild-{os.getpid()}-{time.monotonic_ns()}"
    job = make_job(
        f"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)",
    "{token}"])
open(os.path.join(os.environ["TMPDIR"], "child.pid"), "w").write(str(child.pid))
time.sleep(60)
"""
    )
    outcome = run_job(job, spare=spare_for(job), limits=Limits(timeout_s=1.0, grace_s=0.3))
    assert outcome.launch == "spare"
    assert outcome.timed_out and outcome.signal == "SIGKILL"
    assert (job.runtime.path / "child.pid").exists()  # it was started
    # Found by its argv: inside a sandbox its pid is one of the sandbox's own namespace.
    deadline = time.monotonic() + 5
    while living_with(token):
        assert time.monotonic() < deadline, "the grandchild outlived the job"
        time.sleep(0.01)


def test_a_missing_entry_fails_as_it_would_cold(make_job: MakeJob) -> None:
    job = make_job("", entry="no_such_module")
    cold = run_job(job)
    warm = run_job(job, spare=spare_for(job))
    assert warm.launch == "spare"
    assert cold.returncode == warm.returncode == 1
    assert "No module named no_such_module" in cold.stderr
    assert "No module named no_such_module" in warm.stderr


def test_an_unused_spare_closes_cleanly(make_job: MakeJob) -> None:
    job = make_job(INTROSPECT)
    spare = spare_for(job)
    pid = spare.proc.pid
    spare.close()
    spare.close()  # idempotent
    assert spare.proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_bad_entry_still_uses_up_the_spare(make_job: MakeJob) -> None:
    job = make_job(INTROSPECT, entry="bad-name")
    spare = spare_for(job)
    with pytest.raises(LaunchError, match="dotted module name"):
        run_job(job, spare=spare)
    assert spare.proc.returncode is not None


def test_spec_reaches_a_spare_job(make_job: MakeJob) -> None:
    job = make_job(
        """
import json, os
spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))
json.dump(spec, open(os.environ["AUTOPILOT_RESULT"], "w"))
""",
        spec={"parameters": {"k": 7}},
    )
    outcome = run_job(job, spare=spare_for(job))
    assert outcome.launch == "spare"
    assert outcome.result == json.loads(json.dumps({"parameters": {"k": 7}}))


PRELOADED = """
import json, os, sys
with open(os.environ["AUTOPILOT_RESULT"], "w") as f:
    json.dump({"loaded": "xml.dom.minidom" in sys.modules, "argv": sys.argv}, f)
"""


def test_preloaded_modules_are_imported_before_the_job_and_leave_argv_alone(
    make_job: MakeJob,
) -> None:
    job = make_job(PRELOADED)
    cold = run_job(job)
    warm = run_job(job, spare=spare_for(job, preload=["xml.dom.minidom"]))
    assert warm.launch == "spare", warm.stderr
    assert cold.result["loaded"] is False and warm.result["loaded"] is True
    assert warm.result["argv"] == cold.result["argv"]  # the module names were argv, now gone


def test_a_preload_that_fails_leaves_a_dead_spare_and_the_job_starts_cold(
    make_job: MakeJob,
) -> None:
    job = make_job(PRELOADED)
    spare = spare_for(job, preload=["no_such_module_anywhere"])
    outcome = run_job(job, spare=spare)  # however far the spare got, the job runs cold
    assert outcome.ok and outcome.launch == "cold"
    assert outcome.spare_missed in (
        "the spare exited (3)",
        "the spare exited before it was ready (3)",
    )


def test_a_preload_name_must_be_a_module_name(make_job: MakeJob) -> None:
    job = make_job(PRELOADED)
    with pytest.raises(LaunchError, match="not a dotted module name"):
        spare_for(job, preload=["os; import this"])


def _venv_module(venv: Venv, name: str, body: str) -> None:
    (site,) = Path(venv.path, "lib").glob("python*/site-packages")
    (site / f"{name}.py").write_text(body)


def test_a_spare_still_preloading_is_waited_for_not_bypassed(make_job: MakeJob, venv: Venv) -> None:
    _venv_module(venv, "ap_slow_import", "import time\ntime.sleep(0.5)\n")
    job = make_job(PRELOADED.replace("xml.dom.minidom", "ap_slow_import"))
    spare = spare_for(job, preload=["ap_slow_import"])  # handed the job at once, mid-import
    outcome = run_job(job, spare=spare)
    assert outcome.launch == "spare" and outcome.ok, (outcome.spare_missed, outcome.stderr)
    assert outcome.result["loaded"] is True


def test_a_worktree_module_named_like_a_preload_starts_cold(make_job: MakeJob, venv: Venv) -> None:
    _venv_module(venv, "ap_shadowed", "WHERE = 'venv'\n")
    job = make_job(
        "import json, os, ap_shadowed\n"
        "json.dump(ap_shadowed.WHERE, open(os.environ['AUTOPILOT_RESULT'], 'w'))\n"
    )
    (job.cwd / "ap_shadowed.py").write_text("WHERE = 'worktree'\n")
    outcome = run_job(job, spare=spare_for(job, preload=["ap_shadowed"]))
    assert outcome.launch == "cold" and outcome.result == "worktree"  # as a cold start sees it
    assert outcome.spare_missed is not None and "has its own 'ap_shadowed'" in outcome.spare_missed
