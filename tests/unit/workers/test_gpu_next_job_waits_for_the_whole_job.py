"""The next job starts on the device only once the whole current job is done: at its exit for a
plain job, but after its head-against-base runs for a harness job whose cycle changed code (the
arms measure; nothing else may run on the device meanwhile). The loop's seams (the runner, the
head-against-base runs, the staged next job) record the order in which they were reached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.jobs import service as jobs
from app.jobs.lifecycle import End
from app.settings import Settings
from workers import command_runs
from workers.gpu import run as job_run
from workers.gpu.loop import RunLoop
from workers.gpu.tickets import Ticket, WorkerIdentity
from workers.launcher import runner


class StagedNext:
    """The reserved next job, staged: `go` starts it (idempotent, as `Staged.go`)."""

    def __init__(self, order: list[str]) -> None:
        self.order = order

    def go(self) -> None:
        if "next job started" not in self.order:
            self.order.append("next job started")

    def renew(self, session: object) -> None:
        """Kept with the running job's heartbeat (none beats here)."""


def run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: dict[str, Any], **ran: Any
) -> tuple[list[str], jobs.JobOutcome, Path]:
    order: list[str] = []

    def run_job(_spec: Any, **kw: Any) -> runner.Outcome:
        order.append("main run exited")
        if kw["on_exit"] is not None:
            kw["on_exit"]()
        return runner.Outcome(pid=1, pgid=1, returncode=0, signal=None, timed_out=False,
                              duration_s=0.1, exited_at=0.0, **ran)  # fmt: skip

    def head_vs_base(*_args: Any) -> jobs.JobOutcome:
        order.append("head-vs-base runs done")
        return _args[3]

    monkeypatch.setattr(runner, "run_job", run_job)
    monkeypatch.setattr(command_runs, "head_vs_base", head_vs_base)
    settings = Settings(_env_file=None, state_dir=tmp_path)  # type: ignore[call-arg]
    loop = RunLoop(
        None,  # type: ignore[arg-type]
        settings,
        WorkerIdentity.for_device("cpu", ""),
        sender=object(),  # type: ignore[arg-type]
    )
    loop.reservation = StagedNext(order)  # type: ignore[assignment]
    ticket = Ticket(1, "timing", str(tmp_path), str(tmp_path), spec, 60.0)
    launch = job_run.Launch(spec=None)  # type: ignore[arg-type]
    job = job_run.JobRun(loop, ticket)
    measurement = job_run.measurement_for(ticket)
    assert isinstance(measurement, job_run.Harness)
    outcome = measurement.measure(job, launch, None)  # type: ignore[arg-type]
    return order, outcome, job.log_path


def test_a_plain_job_starts_the_next_at_its_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order, outcome, _ = run(tmp_path, monkeypatch, {"parameters": {}})
    assert outcome.ended is End.COMPLETED
    assert order == ["main run exited", "next job started"]


def test_the_next_job_waits_for_the_head_against_base_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order, outcome, _ = run(tmp_path, monkeypatch, {"parameters": {}, "head_vs_base": True})
    assert outcome.ended is End.COMPLETED
    assert order == ["main run exited", "head-vs-base runs done", "next job started"]


def test_a_run_that_met_a_cgroup_limit_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hit = "the run hit its process limit: 9 fork(s) refused (pids.max = 64)"
    order, outcome, log_path = run(
        tmp_path, monkeypatch, {"parameters": {}}, limit=hit, result_error=hit, events_dropped=3
    )
    assert outcome.ended is End.FAILED
    assert outcome.error == hit  # named once
    log = log_path.read_text()
    assert f"[limits] {hit}" in log
    assert "[events] 3 event(s) dropped" in log
