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
from typing import Any, Literal

Aggregate = Literal["last", "median", "mean", "min", "max"]
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


def render(argv: Sequence[str], parameters: Mapping[str, Any], device: str) -> list[str]:
    """The argv with each `{name}` replaced by the parameter's value (`{device}`: the job's
    device); CommandError names a placeholder that has no value."""
    values = {**{k: _text(v) for k, v in parameters.items()}, DEVICE_PLACEHOLDER: device}

    def fill(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        if name not in values:
            raise CommandError(f"placeholder {{{name}}} has no parameter of that name")
        return values[name]

    return [_PLACEHOLDER.sub(fill, arg) for arg in argv]


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
