"""What the LLM agent is told: the rules and the reply's JSON schema (system message) and the
cycle's context (user message), built from `Context` and the project config alone."""

from __future__ import annotations

import json
from typing import Any

from app.agents.service import Context
from app.projects.config import CONFIG_FILE, ProjectConfig

#: The keys every reply must carry, and the optional one.
REQUIRED_KEYS = (
    "hypothesis",
    "experiment",
    "parameters",
    "what_changed",
    "expected_outcome",
    "proposed_lessons",
)
DIFF_KEY = "diff"

# The prompt stays bounded however long the project's history grows.
_MAX_FINDINGS = 40
_MAX_RECENT = 20
_MAX_JUDGED = 200
_MAX_FILES = 300


def protected_paths(config: ProjectConfig) -> list[str]:
    """What a proposal's diff may not touch: the declared protected and hidden paths and the
    config."""
    declared = [*config.project.protected_paths, *config.project.hidden, CONFIG_FILE]
    return list(dict.fromkeys(declared))


def visible_files(files: list[str], config: ProjectConfig) -> list[str]:
    """The files the prompt may list: none under a hidden path (hold-out data, the evaluator)."""
    hidden = config.project.hidden
    return [f for f in files if not any(f == h or f.startswith(h + "/") for h in hidden)]


def proposal_schema(config: ProjectConfig, *, diff_allowed: bool) -> dict[str, Any]:
    """The JSON schema of a reply (`response_format` json_schema, and quoted in the prompt).

    Not `strict`: `parameters` differs per experiment, which strict mode cannot express
    (it wants every object closed); the service checks the values itself."""
    properties: dict[str, Any] = {
        "hypothesis": {
            "type": "string",
            "description": "one falsifiable sentence: what should happen to the metric and why",
        },
        "experiment": {"type": "string", "enum": sorted(config.experiments)},
        "parameters": {
            "type": "object",
            "description": "values from the experiment's declared space; an omitted parameter "
            "takes the experiment's default",
        },
        "what_changed": {
            "type": "string",
            "description": "what differs from the baseline: the parameters, and the code if a "
            "diff is given",
        },
        "expected_outcome": {"type": "string", "description": "the verdict you expect, and why"},
        "proposed_lessons": {"type": "array", "items": {"type": "string"}},
    }
    if diff_allowed:
        properties[DIFF_KEY] = {
            "type": ["string", "null"],
            "description": "optional: a unified diff (git format, paths a/... b/... from the "
            "repository root) that `git apply` accepts on the base commit; null for no change",
        }
    return {
        "type": "object",
        "properties": properties,
        "required": list(REQUIRED_KEYS),
        "additionalProperties": False,
    }


def messages(
    context: Context, *, diff_allowed: bool, files: list[str] | None = None
) -> list[dict[str, str]]:
    """The opening messages of the exchange: the rules, then the context."""
    schema = proposal_schema(context.config, diff_allowed=diff_allowed)
    return [
        {"role": "system", "content": _system(context.config, schema, diff_allowed)},
        {"role": "user", "content": _user(context, diff_allowed, files or [])},
    ]


def retry_message(error: str) -> str:
    """What the model reads after a reply that was refused: the exact reason."""
    return (
        f"Your proposal was refused: {error}\n"
        "Reply again with one JSON object that follows the schema and the rules."
    )


def _system(config: ProjectConfig, schema: dict[str, Any], diff_allowed: bool) -> str:
    protected = ", ".join(protected_paths(config))
    code_rule = (
        "5. You may change code with `diff`, a unified diff against the base commit. It may "
        f"not touch a protected path ({protected}) nor anything under .git; a diff that "
        "`git apply` refuses is refused. Leave `diff` null when the parameters alone test "
        "the hypothesis."
        if diff_allowed
        else "5. This cycle takes no code change: choose parameters only and send no `diff`."
    )
    return f"""\
You are the research agent of an autonomous research service for GPU and ML-systems code. \
Each research cycle you propose ONE experiment; the service runs it on a GPU, judges the \
result statistically (accuracy first, then speed with a 95% confidence interval) and a person \
reviews the outcome before it becomes a finding.

Rules:
1. Choose a declared experiment, and for each parameter you set, one of the values its \
declared space lists; a parameter you leave out takes the experiment's default. Anything \
else is refused.
2. Never propose a point (experiment and parameters, defaults filled in) that is already \
judged or running without a code change: it is refused. A code change is part of the \
hypothesis: a new change at a judged point is a new test, the same change again is a repeat. \
Any other repeat needs a changed hypothesis, which is a person's call.
3. Accuracy before speed: a result outside the experiment's tolerance fails the accuracy \
gate whatever its speed. Build on validated findings; stay away from refuted ones.
4. State a falsifiable hypothesis: what should happen to the metric, in which direction, \
and why.
{code_rule}

Reply with exactly one JSON object and nothing else, matching this JSON schema:
{json.dumps(schema, indent=2)}
"""


def _user(context: Context, diff_allowed: bool, files: list[str]) -> str:
    config = context.config
    parts = [
        f"# Research cycle for project {context.project} on device kind {context.device_kind}",
        "## Goal\n" + (config.agent.goal.strip() or "Propose the next experiment worth running."),
        "## Experiments\n" + "\n".join(_experiment(name, config) for name in config.experiments),
        "## Protected paths (never edited)\n"
        + "\n".join(f"- {path}" for path in protected_paths(config)),
        _section(
            "Validated and refuted findings",
            [
                f"- finding {f.get('id')} [{f.get('status', 'validated')}, {f.get('kind', '')}]: "
                f"{f.get('statement', '')}"
                for f in context.related
            ],
            _MAX_FINDINGS,
            "none yet",
        ),
        _section(
            "Last cycles (newest first)",
            [_cycle(c) for c in context.recent],
            _MAX_RECENT,
            "none yet",
        ),
        _section(
            "Judged points (each is refused as a proposal)",
            [
                f"- {j.get('experiment')} {_json(j.get('parameters'))}: {j.get('verdict')}"
                + (f" (finding {j['finding']})" if j.get("finding") is not None else "")
                for j in context.judged
            ],
            _MAX_JUDGED,
            "none yet",
        ),
    ]
    files = visible_files(files, context.config)
    if diff_allowed and files:
        parts.append(_section("Files of the repository at the base commit", files, _MAX_FILES, ""))
    parts.append("Propose the next experiment as one JSON object.")
    return "\n\n".join(parts) + "\n"


def _experiment(name: str, config: ProjectConfig) -> str:
    exp = config.experiments[name]
    lines = [
        f"### {name}",
        f"- kind: {exp.kind}"
        + (f" (entry {exp.entry})" if exp.entry else f" (command {_json(exp.command)})"),
        f"- metric: {exp.metric}, {exp.direction} is better",
        f"- tolerance: rtol {exp.tolerance.rtol:g}, atol {exp.tolerance.atol:g}",
        f"- parameter space: {_json(exp.parameters)}",
        f"- defaults (the baseline): {_json(exp.defaults)}",
    ]
    if exp.check_pattern:
        lines.append(
            f"- accuracy check: {exp.check_direction} is better, tolerance {exp.check_tolerance:g}"
        )
    return "\n".join(lines)


def _cycle(c: dict[str, Any]) -> str:
    ratio = c.get("ratio")
    shown = ""
    if ratio is not None:
        shown = f", ratio {ratio:.4g}"
        if c.get("ci_low") is not None and c.get("ci_high") is not None:
            shown += f" (95% CI {c['ci_low']:.4g} to {c['ci_high']:.4g})"
    return (
        f"- cycle {c.get('id')}: {c.get('experiment')} {_json(c.get('parameters'))}; "
        f"hypothesis: {c.get('hypothesis') or '(none)'}; verdict: {c.get('verdict') or 'none'}"
        f"{shown}; state: {c.get('state')}"
    )


def _section(title: str, lines: list[str], limit: int, empty: str) -> str:
    shown = lines[:limit]
    if len(lines) > limit:
        shown.append(f"- ... and {len(lines) - limit} more")
    return f"## {title}\n" + ("\n".join(shown) if shown else empty)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
