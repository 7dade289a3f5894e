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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

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


# -- the runs -----------------------------------------------------------------------------


@dataclass
class Arms:
    """One command job's two arms on this host, and how each of their runs goes: in its arm's
    tree and venv, in the job's sandbox and cgroup, read from outside."""

    settings: Settings
    job_id: int
    experiment: Experiment
    places: dict[str, ArmPlace]
    parameters: dict[str, dict[str, Any]]  # by arm
    device: str  # what {device} becomes: cpu or cuda:0
    device_env: str | None = None  # CUDA_VISIBLE_DEVICES of the runs
    log: TextIO | None = None  # the job log: one line per run
    on_spawn: runner.SpawnCallback | None = None
    cancelled: Callable[[], bool] = lambda: False

    def __post_init__(self) -> None:
        self.argvs = {
            arm: command_kind.render(self.experiment.command, self.parameters[arm], self.device)
            for arm in command_kind.ARMS
        }

    def run(self, plan: Sequence[command_kind.Run]) -> list[dict[str, Any]]:
        """Every run's record, in order; RunFailed names the first run that gave no value.
        Stops early (fewer records) when `cancelled()` says so."""
        records = []
        for run in plan:
            if self.cancelled():
                break
            record = self.run_one(run, len(plan))
            if self.cancelled():
                break
            records.append(record)
        return records

    def run_one(self, run: command_kind.Run, total: int) -> dict[str, Any]:
        experiment, place, argv = self.experiment, self.places[run.arm], self.argvs[run.arm]
        label = f"run {run.index + 1}/{total} ({run.role}, {shlex.join(argv)})"
        metric_file = place.tree / experiment.metric_file if experiment.metric_file else None
        if metric_file is not None:
            with contextlib.suppress(FileNotFoundError):
                metric_file.unlink()  # only this run's file may be read after it
        outcome = _run(
            self.settings,
            self.job_id,
            experiment,
            place,
            argv,
            device_env=self.device_env,
            on_spawn=self.on_spawn,
        )
        name = f"{run.index:03d}-{run.arm}.log"
        _write_log(paths.runs_dir(self.settings, self.job_id) / name, argv, outcome)
        problem = _failure(outcome, experiment.time_limit_s)
        if problem is not None and not self.cancelled():
            raise RunFailed(f"{label} {problem}; last lines:\n{_tail(outcome)}")
        try:
            value, check = self._read(outcome, metric_file)
        except command_kind.CommandError as exc:
            if self.cancelled():
                return {}
            raise RunFailed(f"{label}: {exc}; last lines:\n{_tail(outcome)}") from None
        if self.log is not None:
            shown = f"{experiment.metric}={value:g}" + (
                f", check={check:g}" if check is not None else ""
            )
            self.log.write(
                f"[run {run.index + 1}/{total}] {run.role}: {shown} in {outcome.duration_s:.2f} s\n"
            )
            self.log.flush()
        return {
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

    def _read(
        self, outcome: runner.Outcome, metric_file: Path | None
    ) -> tuple[float, float | None]:
        experiment = self.experiment
        texts = (outcome.stdout, outcome.stderr)
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
        return value, check

    def result(
        self, records: list[dict[str, Any]], *, name: str, spec_device: str, host: str
    ) -> dict[str, Any]:
        """The raw result: every run's value, by arm and role, in block order."""
        experiment = self.experiment

        def by(role: str, key: str = "value") -> list[Any]:
            rows = sorted((r for r in records if r["role"] == role), key=lambda r: r["block"])
            return [r[key] for r in rows]

        result: dict[str, Any] = {
            "status": "ok",
            "kind": "command",
            "experiment": name,
            "metric": experiment.metric,
            "direction": experiment.direction,
            "time_metric": experiment.time_metric,
            "device": spec_device,
            "repeats": experiment.repeats,
            "warmup_runs": experiment.warmup_runs,
            "sandbox": self.settings.sandbox,
            "arms": {
                arm: {
                    "commit": self.places[arm].commit,
                    "parameters": dict(self.parameters[arm]),
                    "command": self.argvs[arm],
                }
                for arm in command_kind.ARMS
            },
            "runs": sorted(records, key=lambda r: r["index"]),
            "samples": {role: by(role) for role in ("baseline", "candidate", "baseline_aa")},
            "environment": {"host": host, "device": self.device_env or "cpu"},
        }
        if experiment.check_pattern is not None:
            result["checks"] = {
                "metric": "check",
                "baseline": by("baseline", "check"),
                "candidate": by("candidate", "check"),
            }
        return result


# -- the lease ----------------------------------------------------------------------------


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
        beat.pgid, beat.spawned_at = pgid, time.time()
        if started:
            return
        started = True
        with stores.ops_session() as session:
            jobs.mark_running(session, ticket.job_id, me.name, pid, pgid)
            jobs.mark_first_line(session, ticket.job_id, me.name, datetime.now(UTC))
        if preparer is not None:
            preparer.kick()  # the job's start is behind it: prepare what follows

    try:
        cfg_path = paths.launch_config(settings, ticket.job_id)
        cfg = project_config.parse(cfg_path.read_text(encoding="utf-8"), str(cfg_path))
        arms = Arms(
            settings,
            ticket.job_id,
            cfg.experiment(ticket.experiment),
            read_arms(settings, ticket.job_id),
            {"baseline": spec["baseline_parameters"], "candidate": spec["parameters"]},
            command_kind.device_name(str(spec.get("device", "cpu"))),
            device_env=me.device or None,
            on_spawn=spawned,
            cancelled=lambda: beat.cancelled,
        )
    except (InvalidInput, OSError, KeyError, ValueError) as exc:
        return jobs.JobOutcome(
            state="failed",
            error=redact_text(f"cannot read the command job's preparation: {exc}"),
            log_path=str(log_path),
        )
    experiment = arms.experiment
    plan = command_kind.schedule(
        experiment.repeats, experiment.warmup_runs, int(spec.get("seed", 0))
    )
    records: list[dict[str, Any]] = []
    error: str | None = None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log_file:
        arms.log = log_file
        if settings.sandbox != "on":
            log_file.write(confine.UNCONFINED_LOG_LINE + "\n")
        for arm in command_kind.ARMS:
            commit = arms.places[arm].commit
            log_file.write(f"[command] {arm} at {commit}: {shlex.join(arms.argvs[arm])}\n")
        log_file.write(
            f"[command] {len(plan)} runs: {experiment.warmup_runs} warm-up per arm, "
            f"{experiment.repeats} blocks of baseline, candidate and A/A baseline\n"
        )
        log_file.flush()
        beat.start()
        try:
            records = arms.run(plan)
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
        result = arms.result(
            records,
            name=ticket.experiment,
            spec_device=str(spec.get("device", "cpu")),
            host=me.host,
        )
        saved = paths.job_dir(settings, ticket.job_id) / "result.json"
        saved.write_text(json.dumps(result, indent=2))
        outcome.state, outcome.exit_code = "succeeded", 0
        outcome.result, outcome.result_path = result, str(saved)
    return outcome


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
