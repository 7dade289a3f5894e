"""The experiment side of the runner protocol: project config, spec, events and result file.

The runner sets ``AUTOPILOT_SPEC`` (a JSON spec), ``AUTOPILOT_EVENTS`` (a Unix stream socket
it listens on) and ``AUTOPILOT_RESULT`` (where result.json goes); ``--spec``/``--result``
override them, and without a spec the experiment runs its project's CPU defaults.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = "1.0"
SPEC_KEYS = {"experiment", "parameters", "device", "seed", "repeats", "tolerance", "options"}
OPTION_KEYS = {"backward": bool, "cuda_graph": bool, "thread_sweep": bool, "factorial": bool}
DEVICES = ("cpu", "cuda")
CONFIG_NAME = "autopilot.toml"


class SpecError(ValueError):
    """The spec or the project config is not something this experiment can run."""


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float

    def as_dict(self) -> dict[str, float]:
        return {"rtol": self.rtol, "atol": self.atol}


@dataclass(frozen=True)
class ExperimentConfig:
    """One ``[experiments.<name>]`` table of autopilot.toml."""

    name: str
    entry: str
    metric: str
    direction: str
    time_limit_s: float | None
    tolerance: Tolerance
    parameters: dict[str, list[Any]]
    defaults: dict[str, Any]


@dataclass(frozen=True)
class Spec:
    experiment: str
    parameters: dict[str, Any]
    device: str
    seed: int
    repeats: int | None
    tolerance: Tolerance
    options: dict[str, bool] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "parameters": self.parameters,
            "device": self.device,
            "seed": self.seed,
            "repeats": self.repeats,
            "tolerance": self.tolerance.as_dict(),
            "options": self.options,
        }


def find_config(*starts: Path) -> Path:
    """The nearest autopilot.toml at or above any of ``starts`` (tried in order)."""
    for start in starts:
        for folder in (start, *start.parents):
            candidate = folder / CONFIG_NAME
            if candidate.is_file():
                return candidate
    raise SpecError(f"no {CONFIG_NAME} found at or above {', '.join(str(s) for s in starts)}")


def _tolerance(raw: Any, where: str) -> Tolerance:
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where} must be a table/object with rtol and atol")
    unknown = set(raw) - {"rtol", "atol"}
    if unknown:
        raise SpecError(f"unknown key(s) in {where}: {', '.join(sorted(unknown))}")
    values = {}
    for key in ("rtol", "atol"):
        if key not in raw:
            raise SpecError(f"{where}.{key} is missing")
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(f"{where}.{key} must be a number, got {type(value).__name__}")
        if not math.isfinite(value) or value <= 0:
            raise SpecError(f"{where}.{key} must be a finite number > 0, got {value!r}")
        values[key] = float(value)
    return Tolerance(values["rtol"], values["atol"])


def load_config(path: Path) -> dict[str, ExperimentConfig]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"cannot read {path}: {exc}") from exc
    experiments = data.get("experiments")
    if not isinstance(experiments, Mapping) or not experiments:
        raise SpecError(f"{path} declares no [experiments.<name>] table")
    out: dict[str, ExperimentConfig] = {}
    for name, table in experiments.items():
        where = f"experiments.{name}"
        params = dict(table.get("parameters", {}))
        for key, allowed in params.items():
            if not isinstance(allowed, list) or not allowed:
                raise SpecError(f"{where}.parameters.{key} must be a non-empty list of values")
        defaults = dict(table.get("defaults", {}))
        undeclared = set(defaults) - set(params)
        if undeclared:
            raise SpecError(f"{where}.defaults has undeclared key(s): {sorted(undeclared)}")
        limit = table.get("time_limit_s")
        out[name] = ExperimentConfig(
            name=name,
            entry=str(table.get("entry", "")),
            metric=str(table.get("metric", "ratio")),
            direction=str(table.get("direction", "lower")),
            time_limit_s=float(limit) if limit is not None else None,
            tolerance=_tolerance(table.get("tolerance", {}), f"{where}.tolerance"),
            parameters=params,
            defaults=defaults,
        )
    return out


def _same_kind(value: Any, allowed: list[Any]) -> bool:
    sample = allowed[0]
    if isinstance(sample, bool):
        return isinstance(value, bool)
    if isinstance(sample, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(sample, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, type(sample))


def _kind_name(allowed: list[Any]) -> str:
    return "boolean" if isinstance(allowed[0], bool) else type(allowed[0]).__name__


def resolve_parameters(raw: Any, config: ExperimentConfig) -> dict[str, Any]:
    """Declared defaults overlaid with the spec's values, each checked against its type."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"parameters must be an object, got {type(raw).__name__}")
    unknown = set(raw) - set(config.parameters)
    if unknown:
        raise SpecError(
            f"unknown parameter(s) for experiment {config.name!r}: {', '.join(sorted(unknown))}"
            f" (declared: {', '.join(sorted(config.parameters))})"
        )
    params = {**config.defaults, **raw}
    for key, allowed in config.parameters.items():
        if key not in params:
            raise SpecError(f"parameter {key!r} has no value and no default")
        if not _same_kind(params[key], allowed):
            raise SpecError(
                f"parameter {key!r} must be {_kind_name(allowed)}, "
                f"got {type(params[key]).__name__} {params[key]!r}"
            )
        if isinstance(params[key], float) and not math.isfinite(params[key]):
            raise SpecError(f"parameter {key!r} must be finite")
    return params


def _int(raw: Mapping[str, Any], key: str, default: int | None, minimum: int) -> int | None:
    if key not in raw or raw[key] is None:
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{key} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise SpecError(f"{key} must be >= {minimum}, got {value}")
    return value


def parse_spec(raw: Any, configs: Mapping[str, ExperimentConfig]) -> Spec:
    if not isinstance(raw, Mapping):
        raise SpecError(f"the spec must be a JSON object, got {type(raw).__name__}")
    unknown = set(raw) - SPEC_KEYS
    if unknown:
        raise SpecError(
            f"unknown spec key(s): {', '.join(sorted(unknown))} "
            f"(allowed: {', '.join(sorted(SPEC_KEYS))})"
        )
    name = raw.get("experiment")
    if not isinstance(name, str):
        raise SpecError(f"experiment must be a string, got {type(name).__name__}")
    if name not in configs:
        raise SpecError(f"unknown experiment {name!r} (declared: {', '.join(sorted(configs))})")
    config = configs[name]
    device = raw.get("device", "cpu")
    if device not in DEVICES:
        raise SpecError(f"device must be one of {DEVICES}, got {device!r}")
    options = raw.get("options", {}) or {}
    if not isinstance(options, Mapping):
        raise SpecError("options must be an object")
    for key, value in options.items():
        if key not in OPTION_KEYS:
            raise SpecError(f"unknown option {key!r} (allowed: {', '.join(sorted(OPTION_KEYS))})")
        if not isinstance(value, OPTION_KEYS[key]):
            raise SpecError(f"option {key!r} must be a boolean, got {type(value).__name__}")
    tolerance = config.tolerance
    if raw.get("tolerance") is not None:
        tolerance = _tolerance(raw["tolerance"], "tolerance")
    return Spec(
        experiment=name,
        parameters=resolve_parameters(raw.get("parameters"), config),
        device=device,
        seed=_int(raw, "seed", 0, 0) or 0,
        repeats=_int(raw, "repeats", None, 3),
        tolerance=tolerance,
        options=dict(options),
    )


def read_spec_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise SpecError(f"cannot read spec {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise SpecError(f"spec {path} is not valid JSON: {exc}") from exc


class EventStream:
    """Newline-delimited JSON events to the runner's Unix socket; silent when there is none.

    Events are advisory (progress for the dashboard), so a missing, refused or stalled socket
    turns the stream off rather than failing or blocking the experiment.
    """

    def __init__(self, path: str | None, *, timeout_s: float = 2.0) -> None:
        self._sock: socket.socket | None = None
        if not path:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            return
        self._sock = sock

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def send(self, event: Mapping[str, Any]) -> None:
        if self._sock is None:
            return
        line = json.dumps(event, separators=(",", ":"), default=str) + "\n"
        try:
            self._sock.sendall(line.encode())
        except OSError:
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


def write_result(path: Path, result: Mapping[str, Any]) -> None:
    """Write result.json atomically, so a reader never sees half a result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".result-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(result, handle, indent=2, allow_nan=False, default=str)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
