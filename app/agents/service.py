"""Agents propose the next experiment: context in, proposal out, validated against the project.

`sweep` (the default) is offline and deterministic: it walks the declared parameter space in
order and skips every point that memory has judged or that a live cycle is already testing.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.agents import grid, informed, presets, workspace
from app.agents.exceptions import AgentFailed
from app.agents.workspace import Workspace
from app.errors import InvalidInput
from app.projects.config import Experiment, ProjectConfig
from app.sandbox import bwrap, confined
from app.sandbox.exceptions import SandboxTimeout

log = logging.getLogger(__name__)


@dataclass
class Context:
    project: str
    device_kind: str
    config: ProjectConfig
    # validated and refuted findings: {"id", "kind", "status", "statement"}
    related: list[dict[str, Any]] = field(default_factory=list)
    # the project's last cycles: {"id", "experiment", "parameters", "hypothesis", "verdict",
    # "ratio", "ci_low", "ci_high", "state"}
    recent: list[dict[str, Any]] = field(default_factory=list)
    # what memory has judged already: {"experiment", "parameters", "verdict", "finding"}
    judged: list[dict[str, Any]] = field(default_factory=list)
    # True when memory or a live cycle already covers (experiment, parameters).
    is_covered: Callable[[str, dict[str, Any]], bool] = lambda _e, _p: False
    # Fingerprints `is_covered` answers True for without asking anyone (the live cycles' and
    # the judged points'), and how a point's fingerprint is made: given both, the sweep walks a
    # space it walked before with a set lookup a point (`grid.py`).
    covered: AbstractSet[str] = frozenset()
    fingerprint: grid.Fingerprint | None = None
    # A campaign's step (docs/design.md, "Research lines"): the line's steps so far, newest
    # first ({"cycle_id", "hypothesis", "outcome", "reason", "why", "ratio", "ci_low",
    # "ci_high", "commit"}), and the hypotheses of the steps running beside it from the same
    # tip (propose something else).
    line: list[dict[str, Any]] | None = None
    parallel_hypotheses: list[str] = field(default_factory=list)
    cycle_id: int | None = None  # the cycle being planned


@dataclass
class Proposal:
    hypothesis: str
    experiment: str
    parameters: dict[str, Any]
    changes: str = ""
    expected: str = ""
    lessons: list[str] = field(default_factory=list)
    tokens: int | None = None
    #: The LLM agent's whole exchange (messages, replies, errors), kept with the cycle.
    exchange: list[dict[str, Any]] | None = None
    #: The code change as content (`GitWork.change_id`), set once the agent's work is taken;
    #: None for a proposal that changes no code. Part of the proposal's fingerprint.
    change_id: str | None = None

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


class SweepAgent:
    name = "sweep"

    def propose(self, context: Context) -> Proposal | None:
        for experiment_name, experiment in context.config.experiments.items():
            for params in self._walk(context, experiment_name, experiment):
                point = {k: params[k] for k in experiment.parameters}
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

    @staticmethod
    def _walk(context: Context, name: str, experiment: Experiment) -> Iterator[dict[str, Any]]:
        """The experiment's points in the sweep's order, lazily (the first one not covered
        ends the walk), past the ones `context.covered` holds without asking `is_covered`."""
        if context.config.agent.order == "informed":
            every = grid.filled(experiment.parameters, experiment.defaults)
            yield from informed.order(name, experiment.parameters, every, context.judged)
            return
        if context.fingerprint is None:
            yield from grid.filled(experiment.parameters, experiment.defaults)
            return
        kept = grid.grid(
            context.project,
            context.device_kind,
            name,
            experiment.parameters,
            experiment.defaults,
            context.fingerprint,
        )
        yield from kept.uncovered(context.covered)


def validate(proposal: Proposal, config: ProjectConfig) -> Proposal:
    """A proposal must name a declared experiment and stay inside its parameter space."""
    experiment = config.experiment(proposal.experiment)
    proposal.parameters = experiment.check_parameters(proposal.parameters)
    if not proposal.hypothesis.strip():
        raise InvalidInput("the proposal states no hypothesis")
    return proposal


AGENTS = ("sweep", "command", "llm")


def for_name(name: str) -> Agent:
    """The offline agent by name (the command agent needs its workspace: see CommandAgent)."""
    if name == "sweep":
        return SweepAgent()
    raise InvalidInput(f"unknown agent {name!r}; available: {', '.join(AGENTS)}")


# -- the command agent ---------------------------------------------------------------------------

# What an agent command may see of our environment: enough to run, none of our secrets.
_AGENT_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "USER", "LOGNAME")
_PROPOSAL_KEYS = {
    "hypothesis",
    "experiment",
    "parameters",
    "what_changed",
    "expected_outcome",
    "proposed_lessons",
    "tokens",
}


@dataclass
class CommandAgent:
    """Runs a configured command (argv, no shell) in the sandbox, in a scratch clone of the
    base commit (`workspace.repo`). It reads the prompt and the context JSON named by
    AUTOPILOT_PROMPT / AUTOPILOT_CONTEXT and must write AUTOPILOT_PROPOSAL; what it changes or
    commits in the clone comes back through `workspace.pack`, checked before it is used.

    With a `preset` (`presets.argv`: claude-code, codex) the argv is a coding-agent CLI's
    headless command line, `argv` (if set) only its program; it reads the prompt on stdin, and
    without a proposal.json the proposal is read from its final message."""

    argv: list[str]
    workspace: Workspace
    time_limit_s: float
    run_name: str  # names its cgroup
    sandboxed: bool = True
    name: str = "command"
    preset: str | None = None
    max_turns: int = 30
    #: What the project asks to pass from the worker's environment, and the operator's
    #: allow-list of it (Settings.agent_env_passthrough).
    env_passthrough: list[str] = field(default_factory=list)
    #: The tokens the coding-agent CLI reported for its last run (None: it reported none).
    tokens: int | None = field(default=None, init=False)
    env_allowed: list[str] = field(default_factory=list)

    def propose(self, context: Context) -> Proposal | None:
        passed = self._passthrough()
        try:
            return self._propose(context, passed)
        except AgentFailed as exc:
            # Its messages quote the agent's own output: never with a passed-through key in it.
            detail = exc.detail
            for value in passed.values():
                if len(value) >= 4:
                    detail = detail.replace(value, "***")
            raise AgentFailed(detail) from None

    def _propose(self, context: Context, passed: dict[str, str]) -> Proposal | None:
        files = self.workspace.files
        prompt, ctx = files / "prompt.md", files / "context.json"
        out = self.workspace.output_log
        proposal_path = files / "proposal.json"
        argv = self.argv
        if self.preset:
            argv = presets.argv(self.preset, self.argv, max_turns=self.max_turns, files=files)
        if not argv:
            raise AgentFailed("agent.command is empty in autopilot.toml; give an argv list")
        proposal_path.unlink(missing_ok=True)
        text = _prompt(context)
        if self.preset:
            text += presets.prompt_note(ctx, proposal_path)
            (files / presets.LAST_MESSAGE).unlink(missing_ok=True)
        prompt.write_text(text, encoding="utf-8")
        ctx.write_text(json.dumps(_context_json(context), indent=2, default=str), "utf-8")
        env = (
            bwrap.allow_env(os.environ, _AGENT_ENV_ALLOW)
            | passed
            | {
                "HOME": str(files),
                "AUTOPILOT_PROMPT": str(prompt),
                "AUTOPILOT_CONTEXT": str(ctx),
                "AUTOPILOT_PROPOSAL": str(proposal_path),
            }
        )
        offset = out.stat().st_size if out.exists() else 0
        try:
            code = confined.run(
                argv,
                workspace.policy(self.workspace, env, argv),
                name=self.run_name,
                timeout_s=self.time_limit_s,
                log_path=out,
                sandbox=self.sandboxed,
                stdin=prompt if self.preset else None,
            )
        except SandboxTimeout:
            raise AgentFailed(
                f"agent command timed out after {self.time_limit_s:g} s and was killed "
                f"(output in {out})"
            ) from None
        except OSError as exc:
            raise AgentFailed(f"agent command {argv[0]!r} cannot start: {exc}") from None
        ran = presets.outcome(self.preset, out, offset, files) if self.preset else None
        if ran is not None:
            self.tokens = ran.tokens  # kept with the cycle even when the agent fails
        if code != 0:
            why = f" ({ran.failure})" if ran and ran.failure else ""
            raise AgentFailed(f"agent command exited with {code}{why}; its output is in {out}")
        if ran is None or os.path.lexists(proposal_path):
            proposal = parse_proposal(proposal_path)
        elif ran.failure:
            raise AgentFailed(f"{ran.failure}; its output is in {out}")
        else:
            proposal = proposal_from(presets.proposal_json(ran.message), "the final message")
        if ran and ran.tokens is not None:
            proposal.tokens = ran.tokens
        if ran:
            cost = f", ${ran.cost_usd:.4f}" if ran.cost_usd is not None else ""
            log.info("%s agent %s: %s tokens%s", self.preset, self.run_name, ran.tokens, cost)
        return proposal

    def _passthrough(self) -> dict[str, str]:
        """The variables the project passes to its agent (their values are never logged)."""
        for name in self.env_passthrough:
            if name not in self.env_allowed:
                raise AgentFailed(
                    f"[agent] env_passthrough names {name}, which the operator has not allowed: "
                    f"add it to AUTOPILOT_AGENT_ENV_PASSTHROUGH on the control host (now "
                    f"{json.dumps(self.env_allowed)}) or drop it from autopilot.toml"
                )
            if not os.environ.get(name):
                raise AgentFailed(
                    f"[agent] env_passthrough names {name}, allowed by "
                    "AUTOPILOT_AGENT_ENV_PASSTHROUGH but not set in the control worker's "
                    "environment: set it there (e.g. in the worker's env file)"
                )
        return {name: os.environ[name] for name in self.env_passthrough}


def parse_proposal(path: Path) -> Proposal:
    data = workspace.read_plain_file(path, workspace.MAX_PROPOSAL_BYTES)
    if data is None:
        raise AgentFailed("the agent wrote no proposal.json (AUTOPILOT_PROPOSAL)")
    raw = data.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:  # nesting past the parser's depth
        raise AgentFailed(f"proposal.json is not valid JSON: {exc}") from None
    return proposal_from(parsed, "proposal.json")


def proposal_from(data: object, source: str) -> Proposal:
    """A Proposal from the agent's JSON (`source` names where it came from in errors)."""
    if not isinstance(data, dict):
        raise AgentFailed(f"{source} must hold a JSON object")
    unknown = sorted(set(data) - _PROPOSAL_KEYS)
    if unknown:
        raise AgentFailed(
            f"{source} has unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_PROPOSAL_KEYS))}"
        )
    for key, kind in (("hypothesis", str), ("experiment", str), ("parameters", dict)):
        if not isinstance(data.get(key), kind):
            raise AgentFailed(f"{source}: {key!r} must be a {kind.__name__}")
    lessons = data.get("proposed_lessons", [])
    if not isinstance(lessons, list) or not all(isinstance(x, str) for x in lessons):
        raise AgentFailed(f"{source}: 'proposed_lessons' must be a list of strings")
    tokens = data.get("tokens")
    return Proposal(
        hypothesis=data["hypothesis"],
        experiment=data["experiment"],
        parameters=data["parameters"],
        changes=str(data.get("what_changed", "")),
        expected=str(data.get("expected_outcome", "")),
        lessons=lessons,
        tokens=tokens if isinstance(tokens, int) else None,
    )


def _prompt(context: Context) -> str:
    return (
        f"# Research cycle for {context.project} ({context.device_kind})\n\n"
        f"{context.config.agent.goal or 'Propose the next experiment worth running.'}\n\n"
        "Read the context JSON (AUTOPILOT_CONTEXT): the project config, validated findings and "
        "recent cycles. Do not repeat a judged experiment without a changed hypothesis. You may "
        "edit (or commit) code in this clone, but not protected paths. Write your proposal as "
        "JSON to AUTOPILOT_PROPOSAL with: hypothesis, experiment, parameters, what_changed, "
        "expected_outcome, proposed_lessons.\n"
    )


def _context_json(context: Context) -> dict[str, Any]:
    return {
        "project": context.project,
        "cycle_id": context.cycle_id,
        "device_kind": context.device_kind,
        "goal": context.config.agent.goal,
        "config": context.config.model_dump(),
        "related_findings": context.related,
        "recent_cycles": context.recent,
        "judged_points": context.judged,
        "line": context.line,
        "parallel_hypotheses": context.parallel_hypotheses,
    }
