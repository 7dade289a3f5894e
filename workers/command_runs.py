"""A command experiment on its GPU host (DESIGN.md, "Experiment kinds"): the repository's own
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
result holds every run's value; the control plane judges it (`app/cycles/judge_command.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.db import Stores
from app.errors import InvalidInput
from app.jobs import paths
from app.jobs import service as jobs
from app.projects import command as command_kind
from app.projects import config as project_config
from app.projects.config import Experiment
from app.settings import Settings, redact_text
from workers.launcher import confine, runner, runtime
from workers.launcher.launch import LaunchError, LaunchSpec
from workers.launcher.venv import Venv, interpreter_path

if TYPE_CHECKING:
    from workers.gpu import Ticket, WorkerIdentity
    from workers.heartbeat import Heartbeat
    from workers.launcher.spare import SpareSlot
    from workers.prepare import Preparer

#: How much of a failing run's output its error shows.
TAIL_LINES = 12
#: The largest metric file read back.
MAX_METRIC_FILE = 1 << 20


class SetupFailed(RuntimeError):
    """The experiment's `setup` failed in one arm's tree: the preparation fails with this."""


class RunFailed(RuntimeError):
    """One run of the schedule gave no usable value: the job fails with this."""


@dataclass(frozen=True)
class ArmPlace:
    """Where one arm was prepared on this host."""

    tree: Path
    venv: Path
    requirements_hash: str
    commit: str | None

    def as_dict(self) -> dict[str, str | None]:
        return {
            "tree": str(self.tree),
            "venv": str(self.venv),
            "requirements_hash": self.requirements_hash,
            "commit": self.commit,
        }


Prepared = tuple[Path, Venv, str | None]


def prepare_arms(
    settings: Settings,
    job_id: int,
    experiment: Experiment,
    *,
    candidate: Prepared,
    baseline: Prepared,
    device: str,
) -> dict[str, ArmPlace]:
    """Run `setup` in both arms' trees and record where the arms are (`arms.json`)."""
    arms = {
        name: ArmPlace(tree, env.path, env.requirements_hash, sha)
        for name, (tree, env, sha) in (("baseline", baseline), ("candidate", candidate))
    }
    if experiment.setup:
        argv = command_kind.render(experiment.setup, {}, device)
        for name, place in arms.items():
            outcome = _run(settings, job_id, experiment, place, argv, device_env=None)
            log = paths.job_dir(settings, job_id) / f"setup-{name}.log"
            _write_log(log, argv, outcome)
            problem = _failure(outcome, experiment.time_limit_s)
            if problem is not None:
                raise SetupFailed(
                    f"setup {shlex.join(argv)} {problem} in the {name} tree "
                    f"({place.commit or 'tip'}); last lines:\n{_tail(outcome)}"
                )
    path = paths.arms_path(settings, job_id)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({k: v.as_dict() for k, v in arms.items()}, indent=2))
    partial.replace(path)
    return arms


def read_arms(settings: Settings, job_id: int) -> dict[str, ArmPlace]:
    raw = json.loads(paths.arms_path(settings, job_id).read_text(encoding="utf-8"))
    return {
        name: ArmPlace(
            Path(raw[name]["tree"]),
            Path(raw[name]["venv"]),
            str(raw[name]["requirements_hash"]),
            raw[name].get("commit"),
        )
        for name in command_kind.ARMS
    }


def program(argv: Sequence[str], venv: Path, env: Mapping[str, str]) -> list[str]:
    """The argv as executed: `python`/`python3` is the venv's interpreter, another bare name is
    looked up on the run's PATH (the venv's bin first), as a shell would."""
    first = argv[0]
    if first in ("python", "python3"):
        first = str(interpreter_path(venv))
    elif "/" not in first:
        first = shutil.which(first, path=env.get("PATH")) or first
    return [first, *argv[1:]]


def _run(
    settings: Settings,
    job_id: int,
    experiment: Experiment,
    place: ArmPlace,
    argv: Sequence[str],
    *,
    device_env: str | None,
    on_spawn: runner.SpawnCallback | None = None,
) -> runner.Outcome:
    rt = runtime.allocate_runtime(state_dir=settings.state_dir.absolute(), env=os.environ)
    try:
        launch = LaunchSpec(
            venv=place.venv,
            entry="",
            cwd=place.tree,
            runtime=rt,
            spec={},
            cuda_visible_devices=device_env,
            base_env=dict(os.environ),
            requirements_hash=place.requirements_hash,
            sandboxed=settings.sandbox == "on",
            network=experiment.network,
            cgroup=confine.job_cgroup_name(job_id),
        )
        launch = _with_argv(launch, program(argv, place.venv, launch.env()))
        try:
            return runner.run_job(
                launch,
                limits=runner.Limits(timeout_s=experiment.time_limit_s, read_result=False),
                on_spawn=on_spawn,
            )
        except LaunchError as exc:
            raise RunFailed(str(exc)) from exc
    finally:
        runtime.release_runtime(rt)


def _with_argv(launch: LaunchSpec, argv: list[str]) -> LaunchSpec:
    return replace(launch, argv=tuple(argv))


def _write_log(path: Path, argv: Sequence[str], outcome: runner.Outcome) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"$ {shlex.join(argv)}\n{outcome.stdout}")
        if outcome.stderr:
            handle.write(f"\n[stderr]\n{outcome.stderr}")


def _tail(outcome: runner.Outcome) -> str:
    lines = [*outcome.stdout.splitlines(), *outcome.stderr.splitlines()]
    text = "\n".join(line for line in lines[-TAIL_LINES:])[-2000:]
    return text or "(no output)"


def _failure(outcome: runner.Outcome, limit_s: float) -> str | None:
    if outcome.timed_out:
        return f"ran past its time limit of {limit_s:g} s and was killed"
    if outcome.returncode != 0:
        return f"exited with {outcome.signal or outcome.returncode}"
    return None


# -- the lease ----------------------------------------------------------------------------


@dataclass
class _Context:
    stores: Stores
    settings: Settings
    me: WorkerIdentity
    ticket: Ticket
    beat: Heartbeat
    experiment: Experiment
    arms: dict[str, ArmPlace]
    argvs: dict[str, list[str]]
    preparer: Preparer | None
    log: Any  # the job log, open for appending
    started: bool = False


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
    try:
        cfg_path = paths.launch_config(settings, ticket.job_id)
        cfg = project_config.parse(cfg_path.read_text(encoding="utf-8"), str(cfg_path))
        experiment = cfg.experiment(ticket.experiment)
        arms = read_arms(settings, ticket.job_id)
        device = command_kind.device_name(str(spec.get("device", "cpu")))
        parameters = {"baseline": spec["baseline_parameters"], "candidate": spec["parameters"]}
        argvs = {
            arm: command_kind.render(experiment.command, parameters[arm], device) for arm in arms
        }
    except (InvalidInput, OSError, KeyError, ValueError) as exc:
        return jobs.JobOutcome(
            state="failed",
            error=redact_text(f"cannot read the command job's preparation: {exc}"),
            log_path=str(log_path),
        )
    plan = command_kind.schedule(
        experiment.repeats, experiment.warmup_runs, int(spec.get("seed", 0))
    )
    records: list[dict[str, Any]] = []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log_file:
        ctx = _Context(
            stores, settings, me, ticket, beat, experiment, arms, argvs, preparer, log_file
        )
        if settings.sandbox != "on":
            log_file.write(confine.UNCONFINED_LOG_LINE + "\n")
        for arm in command_kind.ARMS:
            log_file.write(f"[command] {arm} at {arms[arm].commit}: {shlex.join(argvs[arm])}\n")
        log_file.write(
            f"[command] {len(plan)} runs: {experiment.warmup_runs} warm-up per arm, "
            f"{experiment.repeats} blocks of baseline, candidate and A/A baseline\n"
        )
        log_file.flush()
        error: str | None = None
        beat.start()
        try:
            for run in plan:
                if beat.cancelled:
                    break
                records.append(_one(ctx, run, len(plan)))
        except RunFailed as exc:
            error = str(exc)
        finally:
            beat.stop()
    gpu_seconds = sum(float(r["duration_s"]) for r in records)
    outcome = jobs.JobOutcome(state="failed", log_path=str(log_path), gpu_seconds=gpu_seconds)
    if beat.cancelled:
        outcome.state, outcome.error = "cancelled", "cancelled while running; its runs stopped"
    elif error is not None:
        outcome.error = redact_text(error)
    else:
        result = _result(ctx, records)
        saved = paths.job_dir(settings, ticket.job_id) / "result.json"
        saved.write_text(json.dumps(result, indent=2))
        outcome.state, outcome.exit_code = "succeeded", 0
        outcome.result, outcome.result_path = result, str(saved)
    return outcome


def _one(ctx: _Context, run: command_kind.Run, total: int) -> dict[str, Any]:
    experiment, place = ctx.experiment, ctx.arms[run.arm]
    argv = ctx.argvs[run.arm]
    label = f"run {run.index + 1}/{total} ({run.role}, {shlex.join(argv)})"
    metric_file = place.tree / experiment.metric_file if experiment.metric_file else None
    if metric_file is not None:
        with contextlib.suppress(FileNotFoundError):
            metric_file.unlink()  # only this run's file may be read after it
    outcome = _run(
        ctx.settings,
        ctx.ticket.job_id,
        experiment,
        place,
        argv,
        device_env=ctx.me.device or None,
        on_spawn=lambda pid, pgid: _spawned(ctx, pid, pgid),
    )
    name = f"{run.index:03d}-{run.arm}.log"
    _write_log(paths.runs_dir(ctx.settings, ctx.ticket.job_id) / name, argv, outcome)
    if ctx.beat.cancelled:
        return {"index": run.index, "duration_s": outcome.duration_s}
    problem = _failure(outcome, experiment.time_limit_s)
    if problem is not None:
        raise RunFailed(f"{label} {problem}; last lines:\n{_tail(outcome)}")
    texts = (outcome.stdout, outcome.stderr)
    try:
        if metric_file is not None:
            value = command_kind.read_json_key(
                _read_metric_file(metric_file),
                str(experiment.metric_key),
                f"metric_file {experiment.metric_file!r}",
            )
        else:
            pattern = command_kind.check_pattern(str(experiment.metric_pattern), "metric_pattern")
            value = command_kind.read_pattern(
                texts, pattern, experiment.aggregate, "metric_pattern"
            )
        check = None
        if experiment.check_pattern is not None:
            check_re = command_kind.check_pattern(experiment.check_pattern, "check_pattern")
            check = command_kind.read_pattern(texts, check_re, "last", "check_pattern")
    except command_kind.CommandError as exc:
        raise RunFailed(f"{label}: {exc}; last lines:\n{_tail(outcome)}") from None
    record = {
        "index": run.index,
        "block": run.block,
        "arm": run.arm,
        "role": run.role,
        "value": value,
        "check": check,
        "exit_code": outcome.returncode,
        "duration_s": round(outcome.duration_s, 6),
        "log": f"runs/{name}",
    }
    shown = f"{experiment.metric}={value:g}" + (f", check={check:g}" if check is not None else "")
    ctx.log.write(
        f"[run {run.index + 1}/{total}] {run.role}: {shown} in {outcome.duration_s:.2f} s\n"
    )
    ctx.log.flush()
    return record


def _read_metric_file(path: Path) -> bytes:
    """The file the run wrote, never read through a link or from a FIFO it left there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise command_kind.CommandError(f"metric_file {path.name!r} did not appear") from None
    except OSError as exc:
        raise command_kind.CommandError(
            f"metric_file {path.name!r} is not a plain file ({exc.strerror})"
        ) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise command_kind.CommandError(f"metric_file {path.name!r} is not a plain file")
        data = handle.read(MAX_METRIC_FILE + 1)
    if len(data) > MAX_METRIC_FILE:
        raise command_kind.CommandError(
            f"metric_file {path.name!r} is over {MAX_METRIC_FILE} bytes"
        )
    return data


def _spawned(ctx: _Context, pid: int, pgid: int) -> None:
    """Each run's group is the one a cancel kills; the first run starts the job."""
    ctx.beat.pgid = pgid
    ctx.beat.spawned_at = time.time()
    if ctx.started:
        return
    ctx.started = True
    with ctx.stores.ops_session() as session:
        jobs.mark_running(session, ctx.ticket.job_id, ctx.me.name, pid, pgid)
        jobs.mark_first_line(session, ctx.ticket.job_id, ctx.me.name, datetime.now(UTC))
    if ctx.preparer is not None:
        ctx.preparer.kick()  # the job's start is behind it: prepare what follows


def _result(ctx: _Context, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The raw result: every run's value, by arm and role, in block order."""
    experiment, spec = ctx.experiment, ctx.ticket.spec

    def by(role: str, key: str = "value") -> list[float]:
        rows = sorted((r for r in records if r["role"] == role), key=lambda r: r["block"])
        return [r[key] for r in rows]

    result: dict[str, Any] = {
        "status": "ok",
        "kind": "command",
        "experiment": ctx.ticket.experiment,
        "metric": experiment.metric,
        "direction": experiment.direction,
        "time_metric": experiment.time_metric,
        "device": str(spec.get("device", "cpu")),
        "repeats": experiment.repeats,
        "warmup_runs": experiment.warmup_runs,
        "sandbox": ctx.settings.sandbox,
        "arms": {
            arm: {
                "commit": ctx.arms[arm].commit,
                "parameters": dict(
                    spec["baseline_parameters" if arm == "baseline" else "parameters"]
                ),
                "command": ctx.argvs[arm],
            }
            for arm in command_kind.ARMS
        },
        "runs": sorted(records, key=lambda r: r["index"]),
        "samples": {role: by(role) for role in ("baseline", "candidate", "baseline_aa")},
        "environment": {"host": ctx.me.host, "device": ctx.me.device or "cpu"},
    }
    if experiment.check_pattern is not None:
        result["checks"] = {
            "metric": "check",
            "baseline": by("baseline", "check"),
            "candidate": by("candidate", "check"),
        }
    return result
