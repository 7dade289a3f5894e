"""A command experiment on its GPU host (docs/design.md, "Experiment kinds"): the repository's own
program, run from outside, arm against arm.

Preparation (`prepare_arms`, off the GPU): the candidate's tree (the job's head commit) and the
baseline's (its base commit) are exported clean side by side, each with its venv (shared when
the requirements agree); the experiment's `setup` runs once in each, sandboxed like the runs,
and what it writes stays in that tree. Where the arms are is written to the job's `arms.json`,
in the job's folder, which no run can write.

The lease (`run_command_job`): the runs of `command_kind.schedule` one after another, each a
fresh process in its arm's tree, in the job's sandbox and cgroup, with the run's time limit.
The runner (this process, outside the child) keeps each run's log under `runs/`, reads the
metric from its output (or the JSON file it writes), and fails the job, naming the run and
showing its last lines, when a run exits non-zero, runs out of time or yields no metric. The
result holds every run's value; the control plane judges it (`app/cycles/judge/command.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from app.db import Stores
from app.errors import InvalidInput
from app.jobs import paths, stopping
from app.jobs import service as jobs
from app.jobs.lifecycle import End
from app.projects import command as command_kind
from app.projects import config as project_config
from app.projects.config import Experiment
from app.redaction import redact_text
from app.settings import Settings
from workers import blocks
from workers.arms import (
    ArmPlace,
    Arms,
    RunFailed,
    by_role,
    failure,
    read_arms,
    read_evaluator,
    run_in_arm,
    tail,
    write_arms,
    write_log,
)
from workers.evaluator import Evaluator
from workers.launcher import confine, runner
from workers.launcher.spare import SpareSlot
from workers.launcher.venv import Venv


# What this module needs of the GPU loop's objects (workers/gpu/, prepare.py),
# which import this module: described here, not imported.
class Ticket(Protocol):
    @property
    def job_id(self) -> int: ...
    @property
    def experiment(self) -> str: ...
    @property
    def spec(self) -> dict[str, Any]: ...
    @property
    def gpus(self) -> int: ...
    def device_env(self, worker_device: str) -> str | None: ...


class WorkerIdentity(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def device(self) -> str: ...


class Heartbeat(Protocol):
    pgid: int | None
    cancelled: bool

    def start(self) -> None: ...
    def stop(self) -> None: ...


class Preparer(Protocol):
    def kick(self) -> None: ...


class SetupFailed(RuntimeError):
    """The experiment's `setup` failed in one arm's tree: the preparation fails with this."""


Prepared = tuple[Path, Venv, str | None]


def prepare_arms(
    settings: Settings,
    job_id: int,
    experiment: Experiment,
    *,
    candidate: Prepared,
    baseline: Prepared,
    device: str,
    evaluator: tuple[Prepared, Experiment] | None = None,
) -> dict[str, ArmPlace]:
    """Run `setup` in both arms' trees and record where the arms are (`arms.json`), with the
    hold-out evaluator's tree and declaration (the base commit's: `evaluator`), if any."""
    arms = {
        name: ArmPlace(tree, env.path, env.requirements_hash, sha)
        for name, (tree, env, sha) in (("baseline", baseline), ("candidate", candidate))
    }
    judge = None
    if evaluator is not None:
        (tree, env, sha), declared = evaluator
        judge = Evaluator.declared(tree, env.path, env.requirements_hash, sha, declared)
    if experiment.setup:
        argv = command_kind.render(experiment.setup, {}, device)
        for name, place in arms.items():
            # Off the GPU: CUDA_VISIBLE_DEVICES="" hides every GPU from it (it runs while the
            # GPUs of this host run other jobs).
            outcome = run_in_arm(settings, job_id, experiment, place, argv, device_env="")
            log = paths.job_dir(settings, job_id) / f"setup-{name}.log"
            write_log(log, argv, outcome)
            problem = failure(outcome, experiment.time_limit_s)
            if problem is not None:
                raise SetupFailed(
                    f"setup {shlex.join(argv)} {problem} in the {name} tree "
                    f"({place.commit or 'tip'}); last lines:\n{tail(outcome)}"
                )
    write_arms(settings, job_id, arms, judge)
    return arms


# -- the lease ----------------------------------------------------------------------------


def _arms(
    settings: Settings,
    me: WorkerIdentity,
    ticket: Ticket,
    beat: Heartbeat,
    parameters: dict[str, dict[str, Any]],
    *,
    on_spawn: runner.SpawnCallback,
    spec: dict[str, Any] | None = None,
) -> Arms:
    """The leased job's arms on this host, from the config and `arms.json` its preparation
    kept (never from the export, which is the job's to write)."""
    cfg_path = paths.launch_config(settings, ticket.job_id)
    cfg = project_config.parse(cfg_path.read_text(encoding="utf-8"), str(cfg_path))
    return Arms(
        settings,
        ticket.job_id,
        cfg.experiment(ticket.experiment),
        read_arms(settings, ticket.job_id),
        parameters,
        command_kind.device_name(str(ticket.spec.get("device", "cpu"))),
        device_env=ticket.device_env(me.device),
        on_spawn=on_spawn,
        cancelled=lambda: beat.cancelled,
        spec=spec,
        evaluator=read_evaluator(settings, ticket.job_id),
    )


def _run_logged(
    arms: Arms,
    plan: list[command_kind.Run],
    log_path: Path,
    beat: Heartbeat,
    header: list[str],
    spec: dict[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str | None]:
    """Run `plan` under the job's heartbeat, one line a run in the job log after `header`,
    stopped early where the spec's stopping rule decides (`blocks.run_until_decided`): the
    runs' records, where and why they stopped (None: all of the plan ran), and why the job
    failed (None if it did not). Whatever goes wrong is an outcome to store, never an
    exception: raising would leave the lease to lapse and the job to be retried blind, its
    cause lost."""
    records: list[dict[str, Any]] = []
    stopped: dict[str, Any] | None = None
    error: str | None = None
    try:
        rule = stopping.rule_of(spec)
    except stopping.Unusable as exc:  # the judge would refuse it too
        return records, None, str(exc)
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as log_file:
            arms.log = log_file
            log_file.write("".join(f"{line}\n" for line in header))
            log_file.flush()
            beat.start()
            try:
                records, stop = blocks.run_until_decided(
                    arms, plan, rule, int(spec.get("seed", 0)), gate=spec.get("check")
                )
            finally:
                beat.stop()
            if stop is not None and rule is not None:
                decision, at = stop
                stopped = {
                    "blocks": at.blocks,
                    "max_blocks": rule.max_blocks,
                    "decision": decision,
                    "why": blocks.describe(decision, at, rule),
                }
    except RunFailed as exc:
        error = str(exc)
    except stopping.Unusable as exc:  # the spec's gate is unusable: the judge would refuse it too
        error = f"the job's quality gate is unusable: {exc}"
    except jobs.LeaseLost as exc:
        error = f"the lease was lost: {exc}"
    except OSError as exc:
        error = f"cannot write the job's files in {log_path.parent}: {exc.strerror or exc}"
    return records, stopped, error


def run_command_job(
    stores: Stores,
    settings: Settings,
    me: WorkerIdentity,
    ticket: Ticket,
    beat: Heartbeat,
    *,
    preparer: Preparer | None = None,
    spares: SpareSlot | None = None,
) -> jobs.JobOutcome:
    """Run a leased command job's schedule; its outcome, for the loop to store."""
    log_path = paths.log_path(settings, ticket.job_id)
    if spares is not None:
        spares.discard()  # no interpreter of ours runs a command: nothing to hand over
    spec = ticket.spec
    started = False

    def spawned(pid: int, pgid: int) -> None:
        """Each run's group is the one a cancel kills; the first run starts the job."""
        nonlocal started
        beat.pgid = pgid
        if beat.cancelled:  # asked between two runs: this one goes at once
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        if started:
            return
        started = True
        with stores.ops_session() as session:
            jobs.mark_running(session, ticket.job_id, me.name, pid, pgid)
            jobs.mark_first_line(session, ticket.job_id, me.name, datetime.now(UTC))
        if preparer is not None:
            preparer.kick()  # the job's start is behind it: prepare what follows

    try:
        parameters = {"baseline": spec["baseline_parameters"], "candidate": spec["parameters"]}
        arms = _arms(settings, me, ticket, beat, parameters, on_spawn=spawned)
    except (InvalidInput, OSError, KeyError, ValueError) as exc:
        return jobs.JobOutcome(
            ended=End.FAILED_START,
            error=redact_text(f"cannot read the command job's preparation: {exc}"),
            log_path=str(log_path),
        )
    experiment = arms.experiment
    plan = command_kind.schedule(
        experiment.repeats, experiment.warmup_runs, int(spec.get("seed", 0))
    )
    header = [
        f"[command] {arm} at {arms.places[arm].commit}: {shlex.join(arms.argvs[arm])}"
        for arm in command_kind.ARMS
    ]
    header.append(
        f"[command] {len(plan)} runs: {experiment.warmup_runs} warm-up per arm, "
        f"{experiment.repeats} blocks of baseline, candidate and A/A baseline; "
        f"metric from {experiment.metric_source}"
    )
    if arms.evaluator is not None:
        header.append(
            f"[command] evaluator at {arms.evaluator.commit}: {shlex.join(arms.evaluator.argv)}"
        )
    if "sequential" in spec:
        header.append(f"[command] blocks stop when decided: {spec['sequential']}")
    if settings.sandbox != "on":
        header.insert(0, confine.UNCONFINED_LOG_LINE)
    records, stopped, error = _run_logged(arms, plan, log_path, beat, header, spec)
    # every run's time, a failed one's too: the budgets count GPU time, not verdicts
    outcome = jobs.JobOutcome(
        ended=End.FAILED, log_path=str(log_path), gpu_seconds=arms.spent_s * ticket.gpus
    )
    if beat.cancelled:
        outcome.ended, outcome.error = End.CANCELLED, "cancelled while running; its runs stopped"
    elif error is not None:
        outcome.error = redact_text(error)
    else:
        result = arms.result(
            records,
            name=ticket.experiment,
            spec_device=str(spec.get("device", "cpu")),
            host=me.host,
        )
        if stopped is not None:
            result["stopped"] = stopped
        saved = paths.job_dir(settings, ticket.job_id) / "result.json"
        outcome.ended, outcome.exit_code, outcome.result = End.COMPLETED, 0, result
        try:  # the DB holds the result; the file is the host's copy
            saved.write_text(json.dumps(result, indent=2))
            outcome.result_path = str(saved)
        except OSError:
            outcome.result_path = None
    return outcome


def head_vs_base(
    settings: Settings,
    me: WorkerIdentity,
    ticket: Ticket,
    outcome: jobs.JobOutcome,
    beat: Heartbeat,
) -> jobs.JobOutcome:
    """A harness job whose cycle changed code, after its in-process run at head: its entry
    module at base and at head, arm against arm in the same lease (the result's
    `head_vs_base`). A failing run fails the job, as a command's does."""
    log_path = paths.log_path(settings, ticket.job_id)
    spec = ticket.spec
    try:
        same = {arm: dict(spec["parameters"]) for arm in command_kind.ARMS}
        arms = _arms(
            settings,
            me,
            ticket,
            beat,
            same,
            on_spawn=lambda _pid, pgid: setattr(beat, "pgid", pgid),
            spec=spec,
        )
    except (InvalidInput, OSError, KeyError, ValueError) as exc:
        outcome.ended = End.FAILED
        outcome.error = redact_text(f"cannot read the job's arms for head against base: {exc}")
        return outcome
    experiment = arms.experiment
    plan = command_kind.schedule(
        experiment.repeats, experiment.warmup_runs, int(spec.get("seed", 0))
    )
    header = [
        f"[head-vs-base] the entry at base {arms.places['baseline'].commit} and at head "
        f"{arms.places['candidate'].commit}: {len(plan)} runs"
    ]
    records, stopped, error = _run_logged(arms, plan, log_path, beat, header, spec)
    outcome.gpu_seconds += arms.spent_s * ticket.gpus  # N GPUs held: N x its time
    if beat.cancelled:
        outcome.ended, outcome.error = End.CANCELLED, "cancelled while running; its runs stopped"
        return outcome
    if error is not None:
        outcome.ended, outcome.error = End.FAILED, redact_text(f"head against base: {error}")
        return outcome
    section = arms.result(
        records, name=ticket.experiment, spec_device=str(spec.get("device", "cpu")), host=me.host
    )
    section.update(
        kind="head_vs_base",
        metric="time_ns",
        direction="lower",
        time_metric=True,
        metric_source="harness",
    )
    if stopped is not None:
        section["stopped"] = stopped
    section["in_process_baseline"] = {
        arm: by_role(records, arm, "check") for arm in ("baseline", "candidate")
    }
    result = dict(outcome.result or {})
    result["head_vs_base"] = section
    outcome.result = result
    if outcome.result_path:
        Path(outcome.result_path).write_text(json.dumps(result, indent=2))
    return outcome
