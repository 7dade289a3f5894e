"""Two arms of one job on its GPU host (docs/design.md, "Experiment kinds"): the baseline (the base
commit's clean export, the experiment's defaults) and the candidate (the head commit's, the
proposal's parameters), run one process at a time in the order of `command_kind.schedule`.

Each run is a fresh process in a fresh copy of its arm's tree (the export, with what `setup`
wrote; no run is given the export itself, so nothing a run writes reaches a later one) and in
its arm's venv, in the job's sandbox and cgroup, with the run's time limit; the copy is removed
once the run's value and artifacts are read. This process (the runner, outside the child)
keeps each run's log under the job's `runs/`, reads one value from the run, and raises
`RunFailed`, naming the run and showing its last lines, when a run exits non-zero, runs out of
time, meets a limit of its cgroup or yields no value:

- a command experiment's run is its argv; its value is read by `metric_pattern` (or
  `metric_file`) from its output, or is its wall time on this runner's clock
  (`metric_source = "wall"`), or the hold-out evaluator's (`metric_source = "evaluator"`),
  and its check value is read by `check_pattern` or the evaluator's `evaluator_check_pattern`
  (`workers/command_runs.py` runs those jobs);
- a harness experiment whose cycle changed code also runs its entry module at base and at head
  (`head_vs_base`): a run's value is the median time of the entry's headline variant, its check
  the median time of the in-process baseline variant, from the result.json it writes.

The hold-out evaluator (docs/design.md, "Where a number comes from") is a program of the base
commit, run from a tree of its own (the only one that holds the project's `hidden_paths`) after
each recorded run, in a sandbox of its own: it reads a copy of the run's declared `artifacts`,
read-only, and its output gives the run's metric or check value.

The control plane judges the values (`app/cycles/judge/command.py`); the code never does.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from app.jobs import paths
from app.projects import command as command_kind
from app.projects.config import Experiment
from app.settings import Settings
from workers.evaluator import Evaluator, evaluate, fresh_tree, remove_tree, unlink_inside
from workers.launcher import confine, runner, runtime
from workers.launcher.launch import LaunchError, LaunchSpec
from workers.launcher.venv import interpreter_path

#: How much of a failing run's output its error shows.
TAIL_LINES = 12
#: The largest metric file read back.
MAX_METRIC_FILE = 1 << 20


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


def write_arms(
    settings: Settings,
    job_id: int,
    arms: Mapping[str, ArmPlace],
    evaluator: Evaluator | None = None,
) -> None:
    """Where the job's arms (and its evaluator) were prepared on this host, for the worker that
    leases it."""
    path = paths.arms_path(settings, job_id)
    partial = path.with_name(path.name + ".partial")
    data: dict[str, Any] = {k: v.as_dict() for k, v in arms.items()}
    if evaluator is not None:
        data["evaluator"] = evaluator.as_dict()
    partial.write_text(json.dumps(data, indent=2))
    partial.replace(path)


def read_evaluator(settings: Settings, job_id: int) -> Evaluator | None:
    raw = json.loads(paths.arms_path(settings, job_id).read_text(encoding="utf-8"))
    section = raw.get("evaluator")
    return Evaluator.from_dict(section) if isinstance(section, dict) else None


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


def run_in_arm(
    settings: Settings,
    job_id: int,
    experiment: Experiment,
    place: ArmPlace,
    argv: Sequence[str] | None,
    *,
    device_env: str | None,
    on_spawn: runner.SpawnCallback | None = None,
    spec: Mapping[str, Any] | None = None,
) -> runner.Outcome:
    """One run in `place`: `argv` (a command's), or with None the harness entry module, given
    `spec`, whose result.json is read back."""
    rt = runtime.allocate_runtime(state_dir=settings.state_dir.absolute(), env=os.environ)
    try:
        harness = argv is None
        launch = LaunchSpec(
            venv=place.venv,
            entry=str(experiment.entry) if harness else "",
            cwd=place.tree,
            runtime=rt,
            spec=dict(spec or {}),
            pythonpath=[place.tree] if harness else (),
            cuda_visible_devices=device_env,
            base_env=dict(os.environ),
            requirements_hash=place.requirements_hash,
            sandboxed=settings.sandbox == "on",
            network=experiment.network,
            cgroup=confine.job_cgroup_name(job_id),
        )
        if argv is not None:
            launch = replace(launch, argv=tuple(program(argv, place.venv, launch.env())))
        try:
            return runner.run_job(
                launch,
                limits=runner.Limits(timeout_s=experiment.time_limit_s, read_result=harness),
                on_spawn=on_spawn,
            )
        except LaunchError as exc:
            raise RunFailed(str(exc)) from exc
    finally:
        runtime.release_runtime(rt)


def write_log(path: Path, argv: Sequence[str], outcome: runner.Outcome) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"$ {shlex.join(argv)}\n{outcome.stdout}")
        if outcome.stderr:
            handle.write(f"\n[stderr]\n{outcome.stderr}")
        for line in outcome.notes():  # a limit it met, limits this host could not set
            handle.write(f"\n{line}")


def tail(outcome: runner.Outcome) -> str:
    lines = [*outcome.stdout.splitlines(), *outcome.stderr.splitlines()]
    text = "\n".join(line for line in lines[-TAIL_LINES:])[-2000:]
    return text or "(no output)"


def failure(outcome: runner.Outcome, limit_s: float) -> str | None:
    if outcome.timed_out:
        return f"ran past its time limit of {limit_s:g} s and was killed"
    if outcome.returncode != 0:
        return f"exited with {outcome.signal or outcome.returncode}"
    if outcome.limit:  # whatever it printed, it did not run as written
        return f"hit a limit of its cgroup ({outcome.limit})"
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
    #: A harness experiment's job spec: both arms run its entry module with it.
    spec: Mapping[str, Any] | None = None
    #: The base commit's hold-out evaluator, when the experiment declares one.
    evaluator: Evaluator | None = None
    argvs: dict[str, list[str]] = field(init=False)
    spent_s: float = field(default=0.0, init=False)  # every run's time so far
    variants: set[str] = field(default_factory=set, init=False)  # a harness entry's headline

    @property
    def harness(self) -> bool:
        return self.experiment.kind == "harness"

    def __post_init__(self) -> None:
        if self.harness:
            entry = ["python", "-m", str(self.experiment.entry)]
            self.argvs = {arm: entry for arm in command_kind.ARMS}
            return
        self.argvs = {
            arm: command_kind.render(
                self.experiment.command, self.parameters[arm], self.device, self.experiment.gpus
            )
            for arm in command_kind.ARMS
        }

    def run(self, plan: Sequence[command_kind.Run]) -> list[dict[str, Any]]:
        """Every run's record, in order; RunFailed names the first run that gave no value.
        Stops early (fewer records) when `cancelled()` says so. `spent_s` counts every run's
        time, a failed one's too (it is GPU time all the same)."""
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
        evaluated_keys = (experiment.metric_source, experiment.check_source)
        if not self.harness and self.evaluator is None and "evaluator" in evaluated_keys:
            raise RunFailed(
                f"{label}: the experiment reads the hold-out evaluator, but the base commit's "
                "autopilot.toml declares none for it (the evaluator is always the base's)"
            )
        # Each run in a fresh copy of its arm's export, never in the export itself: nothing
        # a run writes there (a cache, a planted start-up file) reaches a later run.
        run_dir = paths.runs_dir(self.settings, self.job_id) / f"{run.index:03d}-{run.arm}"
        try:
            fresh_tree(place.tree, run_dir / "tree")
        except OSError as exc:
            raise RunFailed(f"{label}: no fresh tree for it: {exc}") from None
        try:
            return self._run_in(run, total, label, replace(place, tree=run_dir / "tree"), argv)
        finally:
            remove_tree(run_dir)

    def _run_in(
        self, run: command_kind.Run, total: int, label: str, place: ArmPlace, argv: list[str]
    ) -> dict[str, Any]:
        """One run in `place` (its fresh tree): its record."""
        experiment = self.experiment
        metric_file = place.tree / experiment.metric_file if experiment.metric_file else None
        if experiment.metric_source != "output":
            metric_file = None  # config refuses one; never read the run's word for it
        # Only this run's files may be read after it (metric_file: a plain name, see config):
        # not one that `setup` left in the export.
        leftovers = [experiment.metric_file] if metric_file is not None else []
        if self.evaluator is not None:
            leftovers += self.evaluator.artifacts
        for relative in leftovers:
            try:
                unlink_inside(place.tree, str(relative))
            except OSError as exc:
                raise RunFailed(f"{label}: {relative} cannot be cleared: {exc.strerror}") from None
        outcome = run_in_arm(
            self.settings,
            self.job_id,
            experiment,
            place,
            None if self.harness else argv,
            device_env=self.device_env,
            on_spawn=self.on_spawn,
            spec=self.spec,
        )
        self.spent_s += outcome.duration_s
        name = f"{run.index:03d}-{run.arm}.log"
        write_log(paths.runs_dir(self.settings, self.job_id) / name, argv, outcome)
        problem = failure(outcome, experiment.time_limit_s)
        if problem is None and self.harness and outcome.result_error:
            problem = f"wrote no usable result: {outcome.result_error}"
        if problem is not None and not self.cancelled():
            raise RunFailed(f"{label} {problem}; last lines:\n{tail(outcome)}")
        evaluated: dict[str, Any] = {}
        try:
            value, check = self._read(outcome, metric_file)
            if self.evaluator is not None and run.role != "warmup" and not self.cancelled():
                evaluating = time.monotonic()
                evaluated = evaluate(
                    self.settings,
                    self.job_id,
                    self.evaluator,
                    index=run.index,
                    arm=run.arm,
                    run_tree=place.tree,
                    device=self.device,
                    device_env=self.device_env,
                    time_limit_s=experiment.time_limit_s,
                    program=program,
                )
                # Its cost beside the run's: a job's time limit counts it, the GPU time too.
                evaluated["seconds"] = time.monotonic() - evaluating
                if evaluated.get("value") is not None:
                    value = evaluated["value"]
                if evaluated.get("check") is not None:
                    check = evaluated["check"]
        except command_kind.CommandError as exc:
            if self.cancelled():
                return {}
            raise RunFailed(f"{label}: {exc}; last lines:\n{tail(outcome)}") from None
        if self.log is not None:
            shown = (f"{experiment.metric}={value:g}" if value is not None else "not evaluated") + (
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
            **(
                {"evaluator_log": evaluated["log"], "evaluator_s": round(evaluated["seconds"], 6)}
                if evaluated
                else {}
            ),
        }

    def _read(
        self, outcome: runner.Outcome, metric_file: Path | None
    ) -> tuple[float | None, float | None]:
        experiment = self.experiment
        if self.harness:
            value, in_process, variant = _headline_times(outcome.result)
            self.variants.add(variant)
            if len(self.variants) > 1:
                raise command_kind.CommandError(
                    f"the entry's headline variant differs between runs ({sorted(self.variants)}):"
                    " head against base compares one variant at both commits; keep its name"
                )
            return value, in_process
        texts = (outcome.stdout, outcome.stderr)
        check = None
        if experiment.check_pattern is not None:
            check_re = command_kind.check_pattern(experiment.check_pattern, "check_pattern")
            check = command_kind.read_pattern(texts, check_re, "last", "check_pattern")
        if experiment.metric_source == "wall":
            # The runner's clock, outside the sandbox: nothing the run prints or writes counts.
            return outcome.duration_s, check
        if experiment.metric_source == "evaluator":
            return None, check  # the evaluator's, once it has run
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
        return value, check

    def result(
        self, records: list[dict[str, Any]], *, name: str, spec_device: str, host: str
    ) -> dict[str, Any]:
        """The raw result: every run's value, by arm and role, in block order."""
        experiment = self.experiment

        def by(role: str, key: str = "value") -> list[Any]:
            return by_role(records, role, key)

        result: dict[str, Any] = {
            "status": "ok",
            "kind": "command",
            "experiment": name,
            "metric": experiment.metric,
            "direction": experiment.direction,
            "time_metric": experiment.time_metric,
            "metric_source": experiment.metric_source,
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
        if self.evaluator is not None:
            result["evaluator"] = {
                "commit": self.evaluator.commit,
                "command": self.evaluator.argv,
                "artifacts": self.evaluator.artifacts,
            }
        if experiment.check_source is not None:
            result["check_source"] = experiment.check_source
            result["checks"] = {
                "metric": "check",
                "baseline": by("baseline", "check"),
                "candidate": by("candidate", "check"),
            }
        return result


def by_role(records: Sequence[Mapping[str, Any]], role: str, key: str = "value") -> list[Any]:
    """One field of the runs of one role, in block order (the pairs line up by block)."""
    rows = sorted((r for r in records if r["role"] == role), key=lambda r: r["block"])
    return [r[key] for r in rows]


def _headline_times(result: Any) -> tuple[float, float, str]:
    """A harness run's value: the median time of its headline variant (comparisons[0], paired
    samples b_ns), as its check the median time of the in-process baseline (a_ns), and the
    variant's name."""
    comparisons = result.get("comparisons") if isinstance(result, dict) else None
    if not isinstance(result, dict) or result.get("status") != "ok":
        error = result.get("error") if isinstance(result, dict) else None
        raise command_kind.CommandError(f"the entry reported no result: {str(error)[:300]}")
    first = comparisons[0] if isinstance(comparisons, list) and comparisons else None
    samples = first.get("samples") if isinstance(first, dict) else None
    try:
        a = [float(v) for v in samples["a_ns"]]  # type: ignore[index]
        b = [float(v) for v in samples["b_ns"]]  # type: ignore[index]
        variant = str(first.get("variant"))  # type: ignore[union-attr]
        return float(statistics.median(b)), float(statistics.median(a)), variant
    except (TypeError, KeyError, ValueError, statistics.StatisticsError):
        raise command_kind.CommandError(
            "the entry's result has no comparisons[0].samples (a_ns, b_ns) to time it by"
        ) from None


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
