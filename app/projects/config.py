"""`autopilot.toml`, the project config at a research repository's root, parsed and validated.

Errors name the file, the key and the expected form, so a person can fix the file in one go.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections import OrderedDict
from pathlib import Path
from threading import Lock
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from app.errors import InvalidInput
from app.projects import command as command_kind
from app.redaction import redact_text

CONFIG_FILE = "autopilot.toml"
_ENTRY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,255}$")
# A PEP 508 requirement by name: `name[extras] <specifiers> ; <marker>` or `name @ <url>`.
_REQUIREMENT = re.compile(
    r"""^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)
    \s*(?:\[[A-Za-z0-9._,\s-]*\])?
    \s*(?:@\s*(?P<url>\S+)\s*|[<>=!~][<>=!~A-Za-z0-9.*+_,\s-]*)?
    (?:;[^;]*)?$""",
    re.VERBOSE,
)
# A pip option: at the line's start, or after whitespace (a per-requirement option such as
# `pkg --config-settings=...`, `--global-option`, `--hash`).
_PIP_OPTION = re.compile(r"(?:^|\s)-")
_DIRECT_URL_SCHEMES = ("https://", "git+https://")
_ARCHIVE_SUFFIXES = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
Scalar = int | float | str | bool


class ConfigError(InvalidInput):
    slug = "invalid-project-config"
    title = "Invalid project config"


class Tolerance(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rtol: float = Field(default=1e-4, gt=0)
    atol: float = Field(default=1e-6, ge=0)


class Experiment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["harness", "command"] = Field(
        default="harness",
        description="harness: an entry module on experiments/harness; command: any program of "
        "the repository, run and read from outside (docs/design.md, 'Experiment kinds')",
    )
    entry: str | None = Field(default=None, description="module run as `python -m <entry>`")
    metric: str = "ratio"
    direction: Literal["lower", "higher"] = "lower"
    time_limit_s: float = Field(
        default=600, gt=0, le=7 * 24 * 3600, description="per job (harness) or per run (command)"
    )
    gpus: int = Field(default=1, ge=1, le=64, description="GPUs of one host, leased at once")
    socket_suffix_len: int = Field(default=40, ge=0, le=100)
    tolerance: Tolerance = Field(default_factory=Tolerance)
    parameters: dict[str, list[Scalar]] = Field(default_factory=dict)
    defaults: dict[str, Scalar] = Field(default_factory=dict)
    imports: list[str] = Field(default_factory=list, description="modules the guard checks")
    network: bool = Field(
        default=False,
        description="give the experiment the host's network; by default its sandbox has none "
        "(a benchmark reads no server, and untrusted code reaches none)",
    )
    # -- kind = "command" ------------------------------------------------------------------
    command: list[str] = Field(default_factory=list, description="argv with {parameter}s")
    setup: list[str] = Field(default_factory=list, description="argv run once per prepared tree")
    metric_pattern: str | None = None
    metric_file: str | None = None
    metric_key: str | None = None
    metric_unit: Literal["time", "other"] | None = None
    aggregate: command_kind.Aggregate = "last"
    repeats: int = Field(default=5, ge=2, le=200, description="blocks: runs per arm")
    warmup_runs: int = Field(default=0, ge=0, le=20)
    # When the blocks stop (docs/design.md, "Sequential verdicts"): `fixed` runs every one of
    # `repeats`; `sequential` stops when the stopping rule decides, `repeats` its maximum.
    stopping: Literal["fixed", "sequential"] = "fixed"
    min_blocks: int = Field(default=3, ge=3, le=200, description="the stopping rule's first look")
    equivalence_margin: float = Field(
        default=0.02, gt=0, lt=1, description="a change smaller than this is equivalent"
    )
    check_pattern: str | None = None
    check_direction: Literal["lower", "higher"] = "lower"
    check_tolerance: float = Field(default=0.02, ge=0, le=10)
    # Where a run's metric comes from (docs/design.md, "Where a number comes from").
    metric_source: command_kind.MetricSource = Field(
        default="output",
        description="output: read from the run's output or metric_file (self-reported when "
        "the cycle changed code); wall: the runner's clock, outside the sandbox; evaluator: "
        "the hold-out evaluator's output",
    )
    evaluator: list[str] = Field(
        default_factory=list,
        description="argv run from the base commit's tree after each run, in a sandbox of its "
        "own, reading the run's declared artifacts: {artifact}, {artifacts}, {device}",
    )
    evaluator_metric_pattern: str | None = None
    evaluator_check_pattern: str | None = None
    artifacts: list[str] = Field(
        default_factory=list, description="files a run writes, relative to its tree"
    )

    @field_validator("command", "setup", "evaluator", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
            raise ValueError(
                f"{value!r} is not an argv: write a list of non-empty strings, no shell, e.g. "
                '["python", "train.py", "--n_layer={n_layer}"]'
            )
        return value

    @field_validator("entry")
    @classmethod
    def _entry(cls, value: str | None) -> str | None:
        if value is not None and not _ENTRY.fullmatch(value):
            raise ValueError(f"{value!r} is not a dotted module name like 'bench.main'")
        return value

    @field_validator("metric_file")
    @classmethod
    def _metric_file(cls, value: str | None) -> str | None:
        if value is not None and (not _FILE_NAME.fullmatch(value) or value in (".", "..")):
            raise ValueError(
                f"{value!r} must be a file name in the run's working directory, no folder: the "
                "runner reads it from outside the sandbox without following links"
            )
        return value

    @field_validator("artifacts")
    @classmethod
    def _artifacts(cls, value: list[str]) -> list[str]:
        for path in value:
            parts = Path(path).parts
            if not path or path.startswith("/") or ".." in parts or "." in path.split("/"):
                raise ValueError(
                    f"artifact {path!r} must be a file path relative to the run's tree, like "
                    "'out/model.pt' (no '/' at the start, no '..')"
                )
        return value

    @model_validator(mode="after")
    def _kind(self) -> Experiment:
        command_keys = (
            "command",
            "setup",
            "metric_pattern",
            "metric_file",
            "check_pattern",
            "evaluator",
            "evaluator_metric_pattern",
            "evaluator_check_pattern",
            "artifacts",
        )
        if self.kind == "harness":
            if self.entry is None:
                raise ValueError("an experiment of kind 'harness' needs `entry`, a module name")
            for key in command_keys:
                if getattr(self, key):
                    raise ValueError(f"`{key}` is for kind = 'command'; this one is 'harness'")
            if self.metric_source != "output":
                raise ValueError(
                    "`metric_source` is for kind = 'command'; a harness experiment's numbers "
                    "come from its harness"
                )
            return self
        try:
            command_kind.check_declaration(self)
        except command_kind.CommandError as exc:
            raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _stopping(self) -> Experiment:
        if self.stopping == "sequential" and self.min_blocks > self.repeats:
            raise ValueError(
                f"min_blocks = {self.min_blocks} is above repeats = {self.repeats}: with "
                "stopping = 'sequential', repeats is the most blocks a job runs and min_blocks "
                "the first it looks after (3 <= min_blocks <= repeats)"
            )
        return self

    @property
    def longest_job_s(self) -> float:
        """The longest a job of this experiment may run: every run of both arms (and, for a
        harness job whose cycle changed code, its in-process run before them) at its limit."""
        runs = 2 * self.warmup_runs + 3 * self.repeats + (self.kind == "harness")
        # An evaluator runs after each recorded run, under the same limit.
        evaluations = 3 * self.repeats if self.evaluator else 0
        return self.time_limit_s * (runs + evaluations)

    @property
    def time_metric(self) -> bool:
        if self.kind == "harness" or self.metric_source == "wall":
            return True
        return command_kind.is_time_metric(self.metric, self.metric_unit)

    @property
    def check_source(self) -> str | None:
        """Where the quality gate's value comes from: the run's output, the evaluator, none."""
        if self.evaluator_check_pattern is not None:
            return "evaluator"
        return "output" if self.check_pattern is not None else None

    @field_validator("parameters")
    @classmethod
    def _space(cls, value: dict[str, list[Scalar]]) -> dict[str, list[Scalar]]:
        for key, allowed in value.items():
            if not allowed:
                raise ValueError(f"parameter {key!r} lists no allowed values")
        return value

    @model_validator(mode="after")
    def _defaults_in_space(self) -> Experiment:
        for key, default in self.defaults.items():
            if key in self.parameters and default not in self.parameters[key]:
                # Small CPU defaults may sit outside the GPU space; they only need a known key.
                continue
            if key not in self.parameters:
                raise ValueError(f"default {key!r} is not a declared parameter")
        return self

    def check_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """The parameters with defaults filled in, or InvalidInput naming the offending key."""
        unknown = sorted(set(parameters) - set(self.parameters))
        if unknown:
            raise InvalidInput(
                f"parameter {unknown[0]!r} is not declared; declared: "
                f"{', '.join(sorted(self.parameters)) or '(none)'}"
            )
        for key, value in parameters.items():
            if value not in self.parameters[key]:
                raise InvalidInput(
                    f"parameter {key}={value!r} is outside the declared space "
                    f"{self.parameters[key]}"
                )
        return {**self.defaults, **parameters}


class Budgets(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu_hours_per_day: float | None = Field(default=None, gt=0)
    concurrent_gpus: int | None = Field(default=None, ge=1)
    llm_tokens_per_day: int | None = Field(
        default=None, ge=1, description="the LLM agent's prompt + completion tokens a day"
    )


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["sweep", "command", "llm"] = "sweep"
    command: list[str] = Field(default_factory=list, description="argv, no shell")
    time_limit_s: float = Field(default=900, gt=0)
    goal: str = ""
    # kind = "sweep"
    order: Literal["grid", "informed"] = Field(
        default="grid",
        description="grid: the declared space in order; informed: points near validated wins "
        "first, points inside a refuted region last",
    )
    # kind = "llm" (the endpoint and key are the operator's: AUTOPILOT_LLM_*)
    model: str | None = Field(default=None, description="overrides AUTOPILOT_LLM_MODEL")
    temperature: float = Field(default=0.2, ge=0, le=2)
    max_tokens: int = Field(default=4096, ge=16, le=200_000)
    max_attempts: int = Field(default=3, ge=1, le=10, description="replies tried per cycle")
    # kind = "command": a coding-agent CLI preset instead of `command`
    preset: Literal["claude-code", "codex"] | None = None
    max_turns: int = Field(default=30, ge=1, le=500, description="a preset's turn limit")
    env_passthrough: list[str] = Field(
        default_factory=list,
        description="variables the agent receives from the worker's environment; each must "
        "also be in the operator's AUTOPILOT_AGENT_ENV_PASSTHROUGH",
    )

    @field_validator("env_passthrough")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name like MY_API_KEY")
        return value


class ProjectSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    gpu_kind: str = "cpu"
    python_requirements: list[str] = Field(default_factory=list)
    protected_paths: list[str] = Field(default_factory=list)
    hidden_paths: list[str] = Field(
        default_factory=list,
        description="hold-out data and the evaluator's code: absent from every run's tree and "
        "the agent's prompt, changed by no candidate, seen only by the evaluator",
    )
    schedule: str | None = Field(default=None, description="'every 2h' or a cron expression")
    preload: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="venv modules (e.g. torch) a GPU worker imports in the interpreter it "
        "parks for the next job, so their import is not GPU idle time",
    )

    @field_validator("python_requirements")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        for line in value:
            check_requirement(line)
        return value

    @field_validator("preload")
    @classmethod
    def _modules(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _ENTRY.fullmatch(name):
                raise ValueError(f"{name!r} is not a dotted module name like 'torch' or 'a.b'")
        return value

    @field_validator("name", "gpu_kind")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a slug (lower-case letters, digits, '-', '_')")
        return value

    @field_validator("protected_paths")
    @classmethod
    def _relative(cls, value: list[str]) -> list[str]:
        for path in value:
            if path.startswith("/") or ".." in Path(path).parts:
                raise ValueError(f"{path!r} must be a path relative to the repository root")
        return value

    @field_validator("hidden_paths")
    @classmethod
    def _hidden(cls, value: list[str]) -> list[str]:
        for path in value:
            bare = path.strip().removeprefix("./").rstrip("/")
            if not bare or path.startswith("/") or ".." in Path(bare).parts or "*" in bare:
                raise ValueError(
                    f"hidden path {path!r} must be a file or folder relative to the repository "
                    "root, like 'holdout' or 'data/test.json' (no glob, no '..')"
                )
            if bare == CONFIG_FILE:
                raise ValueError(f"{CONFIG_FILE} cannot be hidden: every run's runner reads it")
        return value

    @property
    def hidden(self) -> list[str]:
        """`hidden_paths`, each as a bare path relative to the root (no `./`, no final `/`)."""
        return [p.strip().removeprefix("./").rstrip("/") for p in self.hidden_paths]


def check_requirement(line: str) -> str:
    """One line of `python_requirements`, or ValueError naming it and the accepted form.

    The lines become a pip requirements file on every GPU host, and a requirements file takes
    options as well as requirements; so a line is accepted only as a requirement:

    - `name[extras] <version specifiers> ; <marker>` (PEP 508), e.g. `numpy>=1.26`,
      `torch==2.3.* ; platform_machine == "x86_64"`;
    - `name @ https://...` or `name @ git+https://...`, with no credentials in the URL;
    - a blank line or a `#` comment, which is never installed.

    Refused, each with the reason:

    - any pip option, at the start of a line or after a requirement (`--index-url`,
      `--extra-index-url`, `-i`, `-r`, `-c`, `-e`, `-f`/`--find-links`, `--trusted-host`,
      `--config-settings`, `--global-option`, `--hash`...): an index or mirror is the
      operator's to declare, through PIP_INDEX_URL in the workers' environment, never the
      repository's. `--hash` too: harmless in itself, but it switches pip to hash-checking
      mode for the whole file, and the harness, installed by the same pip run from a folder,
      cannot be hashed, so every build would fail;
    - `${VAR}`, which pip expands from the environment it runs in (the mirror's URL, which
      may hold its password); a line break or a trailing backslash, which would make one
      line two or join two;
    - local paths and URLs without a name (`./pkg`, `/opt/pkg`, `file:///...`, a `.whl`), and
      `name @ file:` or `http:` URLs: pip runs on the GPU host outside the checkout, so a
      path names the host's files, not the project's, and a venv is keyed by these lines,
      not by the commit, so it would not follow changes to the folder. The project's own
      code reaches a job on PYTHONPATH (its checkout), not through the venv.
    """
    shown = redact_text(line)
    if any(ord(ch) < 32 and ch != "\t" for ch in line) or line.rstrip().endswith("\\"):
        raise ValueError(f"python_requirements line {shown!r} must be one requirement on one line")
    if not line.strip() or line.strip().startswith("#"):
        return line  # blank and comment lines are never installed
    if _PIP_OPTION.search(line):
        raise ValueError(
            f"python_requirements line {shown!r} is or carries a pip option; autopilot.toml "
            "lists requirements only: declare a package index or mirror through the "
            "operator's PIP_INDEX_URL (and PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST) in the "
            "workers' environment instead"
        )
    if "${" in line:
        raise ValueError(
            f"python_requirements line {shown!r} uses pip's ${{VAR}} expansion, which reads "
            "the worker's environment; write the value out"
        )
    match = _REQUIREMENT.fullmatch(line.strip())
    if not match or match["name"].lower().endswith(_ARCHIVE_SUFFIXES):
        raise ValueError(
            f"python_requirements line {shown!r} is not a requirement: write "
            "`name[extras]>=version ; marker` or `name @ https://...`; local paths and file "
            "URLs are not installed (the project's own code is on the job's PYTHONPATH)"
        )
    url = match["url"]
    if url is not None:
        if not url.startswith(_DIRECT_URL_SCHEMES):
            raise ValueError(
                f"python_requirements line {shown!r}: a direct reference must be an "
                "https:// or git+https:// URL"
            )
        if "@" in url.split("://", 1)[1].split("/", 1)[0]:
            raise ValueError(
                f"python_requirements line {shown!r} carries credentials in its URL; "
                "autopilot.toml is read by every token holder: use a public URL, or a mirror "
                "the operator declares through PIP_INDEX_URL"
            )
    return line


class ProjectConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: ProjectSection
    experiments: dict[str, Experiment] = Field(min_length=1)
    budgets: Budgets = Field(default_factory=Budgets)
    agent: AgentConfig = Field(default_factory=AgentConfig)

    def experiment(self, name: str) -> Experiment:
        try:
            return self.experiments[name]
        except KeyError:
            raise InvalidInput(
                f"experiment {name!r} is not declared in {CONFIG_FILE}; declared: "
                f"{', '.join(sorted(self.experiments))}"
            ) from None


# A project's cycles and jobs keep reading the same file at the same commit (plan, prepare, each
# GPU host's preparation, every retry): each distinct text is parsed once. Keyed by the text
# itself, so a changed file is a new key, never a stale answer; only successes are kept, so an
# error always names the source it came from. A parsed config is shared: readers never change it.
_PARSED_KEEP = 64
_parsed: OrderedDict[str, ProjectConfig] = OrderedDict()
_parsed_lock = Lock()


def parse(text: str, source: str = CONFIG_FILE) -> ProjectConfig:
    key = hashlib.sha256(text.encode()).hexdigest()
    with _parsed_lock:
        hit = _parsed.get(key)
        if hit is not None:
            _parsed.move_to_end(key)
            return hit
    config = _parse(text, source)
    with _parsed_lock:
        _parsed[key] = config
        while len(_parsed) > _PARSED_KEEP:
            _parsed.popitem(last=False)
    return config


def _parse(text: str, source: str) -> ProjectConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    try:
        return ProjectConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{source}: key {key!r}: {message}") from None


def load(repo_dir: Path) -> ProjectConfig:
    path = repo_dir / CONFIG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing; a research repository needs {CONFIG_FILE}") from None
    return parse(text, str(path))
