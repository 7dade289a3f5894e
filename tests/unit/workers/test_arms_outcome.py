"""How a command run's outcome is read: a run that met a cgroup limit fails even when it exited
0, naming the limit, and its log keeps what the runner noted of it."""

from __future__ import annotations

from pathlib import Path

from workers.arms import failure, write_log
from workers.launcher.runner import Outcome


def outcome(**changes: object) -> Outcome:
    base = Outcome(pid=1, pgid=1, returncode=0, signal=None, timed_out=False, duration_s=0.5)
    for key, value in changes.items():
        setattr(base, key, value)
    return base


def test_a_run_that_met_a_limit_fails_naming_it_though_it_exited_0() -> None:
    assert failure(outcome(), 30) is None
    problem = failure(outcome(limit="pids.max: 64 processes reached"), 30)
    assert problem is not None and "pids.max: 64 processes reached" in problem
    # a time limit or an exit code still comes first
    assert "time limit" in str(failure(outcome(timed_out=True, limit="memory.max"), 30))


def test_the_log_keeps_the_runners_notes(tmp_path: Path) -> None:
    log = tmp_path / "runs" / "000-candidate.log"
    write_log(
        log,
        ["python", "train.py"],
        outcome(stdout="step 1\n", limit="memory.max reached", unenforced=["pids.max: no cgroup"]),
    )
    text = log.read_text()
    assert text.startswith("$ python train.py\nstep 1\n")
    assert "[limits] memory.max reached" in text
    assert "[limits] not enforced on this host: pids.max: no cgroup" in text
