"""Command experiments (docs/design.md, "Experiment kinds"): a repository's own program, run from
outside and read from its output.

What both sides share: the argv's `{placeholder}`s and how they are filled, how a run's metric
is read from its output (or from a JSON file it writes), and the order of the runs of the two
arms. The GPU worker runs the schedule (`workers/command_runs.py`); the control plane judges the
values it read (`app/cycles/judge/command.py`). Pure functions: no I/O beyond the file read.
"""

from __future__ import annotations

import json
import math
import random
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Aggregate = Literal["last", "median", "mean", "min", "max"]
#: Where a run's metric comes from (docs/design.md, "Where a number comes from").
MetricSource = Literal["output", "wall", "evaluator"]
#: The sources a candidate cannot write: the runner's clock and the base commit's evaluator.
TRUSTED_SOURCES = ("wall", "evaluator")
Role = Literal["warmup", "baseline", "candidate", "baseline_aa"]
ARMS = ("baseline", "candidate")
#: `{name}`: a parameter's value; `{{` and `}}` are literal braces.
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Names of metrics read as times (the verdict then says faster/slower, not better/worse).
_TIME_NAME = re.compile(r"(?:^|_)(?:ms|s|us|ns|sec|secs|seconds|time|latency)$")
_RATE_NAME = re.compile(r"(?:^|_)per(?:_|$)")  # tokens_per_s: a rate, not a time
#: What `{device}` becomes: a worker pins one GPU with CUDA_VISIBLE_DEVICES, so it is cuda:0.
DEVICE_PLACEHOLDER = "device"
#: What `{gpus}` and `{devices}` become: the job's GPU count, and their CUDA ordinals as the job
#: sees them (`0,1,...`: CUDA numbers the devices of CUDA_VISIBLE_DEVICES from 0).
GPUS_PLACEHOLDER, DEVICES_PLACEHOLDER = "gpus", "devices"
RESERVED_PLACEHOLDERS = (DEVICE_PLACEHOLDER, GPUS_PLACEHOLDER, DEVICES_PLACEHOLDER)
#: The evaluator's placeholders: the one declared artifact's path, the folder holding them all.
ARTIFACT_PLACEHOLDER = "artifact"
ARTIFACTS_PLACEHOLDER = "artifacts"


class CommandError(ValueError):
    """A command experiment's declaration or one of its runs is not usable; the message names
    the key or the run."""


def placeholders(argv: Sequence[str]) -> list[str]:
    """The `{name}`s of an argv, in order of first use; CommandError for a malformed one."""
    found: list[str] = []
    for arg in argv:
        rest = _PLACEHOLDER.sub("", arg)
        if "{" in rest or "}" in rest:
            raise CommandError(
                f"argument {arg!r} has an unmatched brace; write {{name}} for a parameter and "
                "{{ or }} for a literal brace"
            )
        for match in _PLACEHOLDER.finditer(arg):
            name = match.group(1)
            if name is None:
                continue
            if not _NAME.fullmatch(name):
                raise CommandError(
                    f"argument {arg!r} has placeholder {{{name}}}; a placeholder is a parameter "
                    "name like {n_layer} or {device}"
                )
            if name not in found:
                found.append(name)
    return found


def render(
    argv: Sequence[str], parameters: Mapping[str, Any], device: str, gpus: int = 1
) -> list[str]:
    """The argv with each `{name}` replaced by the parameter's value (`{device}`: the job's
    device; `{gpus}`, `{devices}`: its GPUs); CommandError names a placeholder that has no
    value."""
    values = {
        **{k: _text(v) for k, v in parameters.items()},
        DEVICE_PLACEHOLDER: device,
        GPUS_PLACEHOLDER: str(gpus),
        DEVICES_PLACEHOLDER: ",".join(str(i) for i in range(gpus)),
    }

    def fill(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        if name not in values:
            raise CommandError(f"placeholder {{{name}}} has no parameter of that name")
        return values[name]

    return [_PLACEHOLDER.sub(fill, arg) for arg in argv]


class Declaration(Protocol):
    """What `check_declaration` reads of a command experiment (`config.Experiment`)."""

    @property
    def entry(self) -> str | None: ...
    @property
    def command(self) -> list[str]: ...
    @property
    def setup(self) -> list[str]: ...
    @property
    def metric_pattern(self) -> str | None: ...
    @property
    def metric_file(self) -> str | None: ...
    @property
    def metric_key(self) -> str | None: ...
    @property
    def metric_unit(self) -> str | None: ...
    @property
    def metric_source(self) -> str: ...
    @property
    def direction(self) -> str: ...
    @property
    def check_pattern(self) -> str | None: ...
    @property
    def parameters(self) -> Mapping[str, Any]: ...
    @property
    def defaults(self) -> Mapping[str, Any]: ...
    @property
    def evaluator(self) -> list[str]: ...
    @property
    def evaluator_metric_pattern(self) -> str | None: ...
    @property
    def evaluator_check_pattern(self) -> str | None: ...
    @property
    def artifacts(self) -> list[str]: ...


def check_declaration(self: Declaration) -> None:
    """A command experiment's declaration, or CommandError naming the key and the expected
    form (`app/projects/config.py` validates with it)."""
    if self.entry is not None:
        raise CommandError("`entry` is for kind = 'harness'; a command experiment runs `command`")
    if not self.command:
        raise CommandError(
            "a command experiment needs `command`, an argv such as "
            '["python", "train.py", "--n_layer={n_layer}"]'
        )
    _check_source(self)
    if (self.metric_file is None) != (self.metric_key is None):
        raise CommandError("`metric_file` and `metric_key` go together")
    if self.metric_pattern is not None:
        check_pattern(self.metric_pattern, "metric_pattern")
    if self.check_pattern is not None:
        check_pattern(self.check_pattern, "check_pattern")
    _check_evaluator(self)
    for name in sorted(set(self.parameters) & set(RESERVED_PLACEHOLDERS)):
        raise CommandError(
            f"parameter {name!r} has a reserved name: {{{name}}} is the job's own "
            f"({', '.join('{' + n + '}' for n in RESERVED_PLACEHOLDERS)}); rename the parameter"
        )
    for name in placeholders(self.command):
        if name in RESERVED_PLACEHOLDERS:
            continue
        if name not in self.parameters:
            raise CommandError(
                f"command placeholder {{{name}}} is not a declared parameter; declared: "
                f"{', '.join(sorted(self.parameters)) or '(none)'}"
            )
        if name not in self.defaults:
            raise CommandError(
                f"command placeholder {{{name}}} has no default: the baseline arm runs "
                "with [defaults], so each parameter of the command needs one"
            )
    for name in placeholders(self.setup):
        if name != DEVICE_PLACEHOLDER:
            raise CommandError(
                f"setup placeholder {{{name}}}: setup runs once per prepared tree, for "
                "every parameter, so it takes only {device}"
            )


def _check_source(self: Declaration) -> None:
    """Each metric source and the keys it takes (docs/experiments.md, "The keys")."""
    read_keys = ("metric_pattern", "metric_file")
    if self.metric_source == "output":
        if (self.metric_pattern is None) == (self.metric_file is None):
            raise CommandError(
                "a command experiment reads its metric with `metric_pattern` (a regex with "
                "a `value` group) or with `metric_file` and `metric_key`: exactly one of the "
                "two (or set metric_source = 'wall' or 'evaluator')"
            )
        if self.evaluator_metric_pattern is not None:
            raise CommandError(
                "`evaluator_metric_pattern` is read only with metric_source = 'evaluator'"
            )
        return
    for key in read_keys:
        if getattr(self, key) is not None:
            raise CommandError(
                f"`{key}` reads the run's own output, but metric_source = "
                f"{self.metric_source!r} takes the metric from "
                + ("the runner's clock" if self.metric_source == "wall" else "the evaluator")
                + f": drop `{key}` (or set metric_source = 'output')"
            )
    if self.metric_source == "wall":
        if self.direction != "lower":
            raise CommandError(
                "metric_source = 'wall' is the run's wall time: direction must be 'lower'"
            )
        if self.metric_unit == "other":
            raise CommandError(
                "metric_source = 'wall' is a time: drop metric_unit or make it 'time'"
            )
        if self.evaluator_metric_pattern is not None:
            raise CommandError(
                "`evaluator_metric_pattern` is read only with metric_source = 'evaluator'"
            )
        return
    if not self.evaluator or self.evaluator_metric_pattern is None:
        raise CommandError(
            "metric_source = 'evaluator' needs `evaluator` (an argv run from the base "
            'commit after each run, e.g. ["python", "holdout/evaluate.py", '
            '"--model={artifact}"]) and `evaluator_metric_pattern` (a regex with a '
            "`value` group, read from the evaluator's output)"
        )


def _check_evaluator(self: Declaration) -> None:
    if self.evaluator_metric_pattern is not None:
        check_pattern(self.evaluator_metric_pattern, "evaluator_metric_pattern")
    if self.evaluator_check_pattern is not None:
        check_pattern(self.evaluator_check_pattern, "evaluator_check_pattern")
        if self.check_pattern is not None:
            raise CommandError(
                "`check_pattern` and `evaluator_check_pattern` both declare the quality "
                "gate: keep one (the evaluator's is not the candidate's word)"
            )
    if not self.evaluator:
        for key in ("evaluator_check_pattern", "artifacts"):
            if getattr(self, key):
                raise CommandError(
                    f"`{key}` is read by the evaluator; declare `evaluator` (an argv) too"
                )
        return
    if self.evaluator_metric_pattern is None and self.evaluator_check_pattern is None:
        raise CommandError(
            "`evaluator` gives the run's metric (metric_source = 'evaluator' with "
            "`evaluator_metric_pattern`) or its quality gate (`evaluator_check_pattern`): "
            "declare at least one"
        )
    check_evaluator_argv(self.evaluator, self.artifacts)


def check_evaluator_argv(argv: Sequence[str], artifacts: Sequence[str]) -> None:
    """The evaluator's argv takes `{artifact}` (only with exactly one declared artifact),
    `{artifacts}` and `{device}`; CommandError names any other placeholder."""
    allowed = (ARTIFACT_PLACEHOLDER, ARTIFACTS_PLACEHOLDER, DEVICE_PLACEHOLDER)
    for name in placeholders(argv):
        if name not in allowed:
            raise CommandError(
                f"evaluator placeholder {{{name}}}: the evaluator takes {{artifact}} (the one "
                "declared artifact), {artifacts} (the folder of all of them) and {device}"
            )
        if name == ARTIFACT_PLACEHOLDER and len(artifacts) != 1:
            raise CommandError(
                f"evaluator placeholder {{artifact}} needs exactly one declared artifact (there "
                f"are {len(artifacts)}); use {{artifacts}}/<path> for several"
            )


def render_evaluator(
    argv: Sequence[str], artifacts: Sequence[str], folder: str, device: str
) -> list[str]:
    """The evaluator's argv for one run, its artifacts copied under `folder`."""
    values = {ARTIFACTS_PLACEHOLDER: folder}
    if len(artifacts) == 1:
        values[ARTIFACT_PLACEHOLDER] = f"{folder}/{artifacts[0]}"
    return render(argv, values, device)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def device_name(spec_device: str) -> str:
    """`{device}` for a job whose spec says `cpu` or `cuda`."""
    return "cpu" if spec_device == "cpu" else "cuda:0"


def is_time_metric(metric: str, unit: str | None = None) -> bool:
    if unit is not None:
        return unit == "time"
    name = metric.lower()
    return bool(_TIME_NAME.search(name)) and not _RATE_NAME.search(name)


def check_pattern(pattern: str, key: str) -> re.Pattern[str]:
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise CommandError(f"{key} {pattern!r} is not a regular expression: {exc}") from None
    if "value" not in compiled.groupindex:
        raise CommandError(
            f"{key} {pattern!r} has no named group `value`; write e.g. 'time (?P<value>[0-9.]+)ms'"
        )
    return compiled


def aggregate(values: Sequence[float], how: Aggregate) -> float:
    if how == "last":
        return values[-1]
    if how == "median":
        return float(statistics.median(values))
    if how == "mean":
        return float(statistics.fmean(values))
    return float(min(values) if how == "min" else max(values))


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CommandError(f"{what} matched {text[:40]!r}, which is not a number") from None
    if not math.isfinite(value):
        raise CommandError(f"{what} matched {text[:40]!r}, which is not a finite number")
    return value


def read_pattern(
    texts: Iterable[str], pattern: re.Pattern[str], how: Aggregate, what: str
) -> float:
    """The aggregate of every `value` the pattern matches in `texts` (stdout, then stderr)."""
    found = [
        _number(match.group("value"), what)
        for text in texts
        for match in pattern.finditer(text)
        if match.group("value") is not None
    ]
    if not found:
        raise CommandError(f"{what} '{pattern.pattern}' never matched the run's output")
    return aggregate(found, how)


def read_json_key(data: bytes, key: str, what: str) -> float:
    """`key` (dotted: `eval.loss`) of the JSON document a run wrote."""
    try:
        node: Any = json.loads(data)
    except ValueError as exc:
        raise CommandError(f"{what} is not valid JSON: {exc}") from None
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise CommandError(f"{what} has no key {key!r}")
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, int | float | str):
        raise CommandError(f"{what}: {key!r} is {type(node).__name__}, not a number")
    return _number(str(node), f"{what}: {key!r}")


@dataclass(frozen=True)
class Run:
    """One run of the schedule: which arm, in which block, as what."""

    index: int
    arm: str  # "baseline" or "candidate": whose tree and parameters
    role: Role
    block: int | None  # None for a warm-up


def schedule(repeats: int, warmup_runs: int, seed: int) -> list[Run]:
    """The order of one job's runs: `warmup_runs` unrecorded runs of each arm, then `repeats`
    blocks, each one candidate run and two baseline runs (the second is the A/A pair's) in an
    order drawn from `seed`, so that drift in the machine falls on both arms alike."""
    rng = random.Random(seed)  # noqa: S311 - a run order, not a secret
    runs: list[Run] = []
    for _ in range(warmup_runs):
        for arm in ARMS:
            runs.append(Run(len(runs), arm, "warmup", None))
    roles: list[Role] = ["baseline", "candidate", "baseline_aa"]
    for block in range(repeats):
        order = roles[:]
        rng.shuffle(order)
        for role in order:
            arm = "candidate" if role == "candidate" else "baseline"
            runs.append(Run(len(runs), arm, role, block))
    return runs
