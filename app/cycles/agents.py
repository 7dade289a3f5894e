"""Agents propose the next experiment: context in, proposal out, validated against the project.

`sweep` (the default) is offline and deterministic: it walks the declared parameter space in
order and skips every point that memory has judged or that a live cycle is already testing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.cycles.config import ProjectConfig
from app.errors import InvalidInput


@dataclass
class Context:
    project: str
    device_kind: str
    config: ProjectConfig
    related: list[dict[str, Any]] = field(default_factory=list)  # validated findings, bounds
    recent: list[dict[str, Any]] = field(default_factory=list)  # recent cycles and verdicts
    # True when memory or a live cycle already covers (experiment, parameters).
    is_covered: Callable[[str, dict[str, Any]], bool] = lambda _e, _p: False


@dataclass
class Proposal:
    hypothesis: str
    experiment: str
    parameters: dict[str, Any]
    changes: str = ""
    expected: str = ""
    lessons: list[str] = field(default_factory=list)
    tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "hypothesis": self.hypothesis,
            "experiment": self.experiment,
            "parameters": self.parameters,
            "what_changed": self.changes,
            "expected_outcome": self.expected,
            "proposed_lessons": self.lessons,
        }


class Agent(Protocol):
    name: str

    def propose(self, context: Context) -> Proposal | None:
        """The next proposal, or None when there is nothing left worth testing."""


class NothingToPropose(InvalidInput):
    slug = "nothing-to-propose"
    title = "Nothing left to propose"


def points(space: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    keys = list(space)
    for values in itertools.product(*(space[k] for k in keys)):
        yield dict(zip(keys, values, strict=True))


class SweepAgent:
    name = "sweep"

    def propose(self, context: Context) -> Proposal | None:
        for experiment_name, experiment in context.config.experiments.items():
            for point in points(experiment.parameters):
                params = {**experiment.defaults, **point}
                if context.is_covered(experiment_name, params):
                    continue
                shown = ", ".join(f"{k}={v}" for k, v in point.items())
                return Proposal(
                    hypothesis=(
                        f"{experiment_name} at {shown} on {context.device_kind}: the variant "
                        f"beats the baseline on {experiment.metric} ({experiment.direction} "
                        "is better) within tolerance"
                    ),
                    experiment=experiment_name,
                    parameters=params,
                    changes="no code change: a sweep point of the declared space",
                    expected="a verdict with a 95% confidence interval for this point",
                )
        return None


def validate(proposal: Proposal, config: ProjectConfig) -> Proposal:
    """A proposal must name a declared experiment and stay inside its parameter space."""
    experiment = config.experiment(proposal.experiment)
    proposal.parameters = experiment.check_parameters(proposal.parameters)
    if not proposal.hypothesis.strip():
        raise InvalidInput("the proposal states no hypothesis")
    return proposal


def for_name(name: str) -> Agent:
    if name == "sweep":
        return SweepAgent()
    raise InvalidInput(f"unknown agent {name!r}; available: sweep")
