"""The one place settings come from: `AUTOPILOT_*` variables, an optional `.env`, embedded defaults.

The embedded defaults need no server: two SQLite files and kombu's filesystem broker under the
state dir, and the local forge. Production points the URLs at PostgreSQL and Redis.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    SettingsConfigDict,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from app.redaction import redact_text, redact_url
from app.sandbox.cgroups import RunLimits

ENV_PREFIX = "AUTOPILOT_"
_BROKER_SCHEMES = ("filesystem", "redis", "rediss", "memory")


class StoreSettings(BaseModel):
    """Where state lives: the state dir, the two databases and the broker."""

    state_dir: Path = Field(default=Path("./var"), description="Where the embedded stores live.")

    memory_url: str | None = Field(
        default=None, description="Research memory DB; default: SQLite in the state dir."
    )

    ops_url: str | None = Field(
        default=None, description="Operational DB; default: SQLite in the state dir."
    )

    broker_url: str = Field(default="filesystem://", description="Celery broker.")

    @field_validator("memory_url", "ops_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError(
                "not a database URL; expected e.g. sqlite:///var/ops.db or "
                "postgresql+psycopg://user@host:5432/db"
            ) from None
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(
                f"unsupported database {url.get_backend_name()!r}; expected sqlite or postgresql"
            )
        return value

    @field_validator("broker_url")
    @classmethod
    def _broker(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in _BROKER_SCHEMES:
            raise ValueError(
                "expected filesystem:// (embedded) or redis://host:6379/0 (production)"
            )
        return value

    # Derived values: computed, never stored twice.
    @property
    def memory_database_url(self) -> str:
        return self.memory_url or f"sqlite:///{self.state_dir.absolute() / 'memory.db'}"

    @property
    def ops_database_url(self) -> str:
        return self.ops_url or f"sqlite:///{self.state_dir.absolute() / 'ops.db'}"

    @property
    def broker_dir(self) -> Path:
        return self.state_dir.absolute() / "broker"


class ApiSettings(BaseModel):
    """The control host's API and dashboard: where they listen and are reached, tokens, limits."""

    host: str = "127.0.0.1"

    port: int = Field(default=8000, ge=1, le=65535)

    control_url: str = Field(
        default="",
        description="The API's base URL as other hosts reach it (GPU hosts fetch the local "
        "forge from <control_url>/git/<project>.git); default: http://<host>:<port>.",
    )

    dashboard_url: str = Field(
        default="",
        description="The dashboard's base URL as reviewers reach it: pull request bodies link "
        "to a cycle's page and its findings there; default: <control_url>/dashboard.",
    )

    control_token: SecretStr | None = Field(
        default=None, description="A GPU host's token (scope worker) for the control host's API."
    )

    token: SecretStr | None = Field(
        default=None,
        description="A person's token for the CLI's remote commands (`autopilot --api URL`); "
        "`autopilot login` keeps one in the CLI's config file instead.",
    )

    session_secret: SecretStr | None = Field(
        default=None, description="Signs dashboard cookies; generated in the state dir if unset."
    )

    trusted_proxies: list[str] = Field(
        default_factory=lambda: ["127.0.0.1"],
        description="Addresses whose X-Forwarded-Proto/-For `autopilot serve` believes (uvicorn's "
        "forwarded_allow_ips): the TLS proxy in front of the API, so its cookies are Secure.",
    )

    cookie_secure: Literal["auto", "always"] = Field(
        default="auto",
        description="auto: dashboard cookies are Secure when the request came over HTTPS (as a "
        "trusted proxy says); always: whatever the request says.",
    )

    max_streams_per_token: int = Field(
        default=8,
        ge=1,
        description="Open server-sent-event streams (live dashboard pages, followed job logs) "
        "per token in one API process; one more is refused with 429.",
    )

    metrics_auth: Literal["token", "public"] = Field(
        default="token",
        description="/metrics names worker hosts: `token` asks for AUTOPILOT_METRICS_TOKEN or any "
        "API token that may read; `public` only where the API's bind is private to the scraper.",
    )

    metrics_token: SecretStr | None = Field(
        default=None, description="A scraper's bearer token for /metrics, and nothing else."
    )

    idempotency_ttl_s: float = Field(
        default=24 * 3600,
        gt=0,
        description="How long an Idempotency-Key of POST /api/v1/cycles is remembered: a reuse "
        "within it returns the first cycle (or 422 with another body); after it, a new cycle.",
    )

    cors_origins: list[str] = Field(default_factory=list)

    max_request_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="The largest request body, except on the routes that need more: a memory "
        "import (its file limit, 50 MB, plus the form), a job's log upload "
        "(AUTOPILOT_MAX_JOB_LOG_BYTES) and the git endpoint's fetch negotiation (16 MiB).",
    )

    max_job_log_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="The largest job log a GPU host may upload (PUT /api/v1/jobs/<id>/log).",
    )

    token_cache_s: float = Field(
        default=5.0,
        ge=0,
        description="How long an API process trusts a bearer token it verified without asking "
        "the DB again: a revocation by another process takes effect within it (0: always ask).",
    )

    @field_validator("control_url")
    @classmethod
    def _control_url(cls, value: str) -> str:
        return _base_url(value, "the API's base URL, e.g. http://control.lab:8000")

    @field_validator("dashboard_url")
    @classmethod
    def _dashboard_url(cls, value: str) -> str:
        return _base_url(value, "the dashboard's base URL, e.g. https://autopilot.lab/dashboard")

    _control_url_built: bool = PrivateAttr(default=False)

    @property
    def control_url_built(self) -> bool:
        """Whether `control_url` was built from `host` and `port` (none, or an empty one, was
        given): then it names this machine's API, not a control host chosen by anyone."""
        return self._control_url_built

    @model_validator(mode="after")
    def _default_control_url(self) -> Self:
        if not self.control_url:
            self._control_url_built = True
            # A bind-all address is no address to reach: the API on this machine is loopback.
            host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host  # noqa: S104
            host = "[::1]" if host == "::" else f"[{host}]" if ":" in host else host
            self.control_url = f"http://{host}:{self.port}"
        return self

    @property
    def dashboard_base_url(self) -> str:
        """The dashboard as reviewers reach it: `dashboard_url`, else the API's `/dashboard`
        (worked out on each read, so a copy with another control URL follows it)."""
        return self.dashboard_url or f"{self.control_url}/dashboard"


class ForgeSettings(BaseModel):
    """Where pull requests go (the local forge or GitHub) and who commits."""

    forge: Literal["local", "github"] = "local"

    github_token: SecretStr | None = None

    github_base_url: str = "https://api.github.com"

    # GitHub App credentials, used instead of the token when all three are set.
    github_app_id: str | None = None

    github_app_private_key: SecretStr | None = None

    github_app_installation_id: int | None = None

    git_author_name: str = "Research Autopilot"

    git_author_email: str = "autopilot@localhost"

    github_seconds_between_requests: float | None = Field(
        default=0.25,
        ge=0,
        description="PyGithub's pause between two requests to GitHub (None: no pause).",
    )

    github_seconds_between_writes: float | None = Field(
        default=1.0,
        ge=0,
        description="PyGithub's pause between two writes (GitHub asks integrations to space "
        "content-creating requests).",
    )

    github_webhook_secret: SecretStr | None = Field(
        default=None,
        description="The secret of the GitHub webhook (POST /api/v1/webhooks/github): each "
        "delivery's X-Hub-Signature-256 is checked with it; unset, every delivery is refused.",
    )

    github_reconcile_interval_s: float = Field(
        default=300.0,
        gt=0,
        description="How often beat reads the pull requests of cycles awaiting review from "
        "GitHub and applies a merge or close no webhook delivered.",
    )

    notify_url: SecretStr | None = Field(
        default=None,
        description="A Slack- or Mattermost-compatible incoming webhook: told when a cycle "
        "awaits review or failed. Secret: such a URL carries its own token.",
    )

    notify_attempts: int = Field(
        default=5, ge=1, le=20, description="Tries at delivering one notification."
    )

    notify_backoff_s: float = Field(
        default=2.0,
        ge=0,
        description="The wait after a notification's first failed try, doubled after each.",
    )

    notify_timeout_s: float = Field(default=10.0, gt=0, description="One try's time limit.")


class AgentSettings(BaseModel):
    """The agents that propose: the LLM endpoint and what a command agent may receive."""

    llm_base_url: str | None = Field(
        default=None,
        description='The research agent\'s OpenAI-compatible endpoint ([agent] kind = "llm"): '
        "a hosted API or a local vLLM, llama.cpp or Ollama server, e.g. http://127.0.0.1:8001/v1.",
    )

    llm_model: str | None = Field(default=None, description="The model name; [agent] model wins.")

    llm_api_key: SecretStr | None = Field(
        default=None, description="The endpoint's key: sent in the agent's own requests only."
    )

    llm_timeout_s: float = Field(default=120.0, gt=0, description="One request's time limit.")

    agent_env_passthrough: list[str] = Field(
        default_factory=list,
        description="Variables a command agent may receive from the worker's environment when "
        "its [agent] env_passthrough names them (a coding agent's own API key, e.g. "
        "ANTHROPIC_API_KEY): the operator's allow-list; nothing else reaches an agent.",
    )


class QueueSettings(BaseModel):
    """The GPU handoff queue and its hosts: kinds, leases, preparation, budgets, sandbox, venvs."""

    # The GPU handoff queue. One queue per kind: gpu.<kind>.
    gpu_kinds: list[str] = Field(default_factory=lambda: ["cpu", "a100", "h100", "h200", "l40s"])

    lease_ttl_s: float = Field(default=30.0, gt=0, description="A lease lapses unless renewed.")

    heartbeat_interval_s: float = Field(default=5.0, gt=0)

    gpu_spare_interpreter: bool = Field(
        default=True,
        description="While a job runs, park the next job's interpreter (saves its start-up).",
    )

    gpu_reserve_next: bool = Field(
        default=True,
        description="While a job runs, reserve the next job (a lease it may not run yet), so "
        "the next job starts with no DB round trip on the GPU's idle gap.",
    )

    gpu_reserve_after_s: float = Field(
        default=1.0,
        ge=0,
        description="Only a job ready (prepared on the host) this long is reserved: an idle "
        "worker takes a fresh one within its doorbell's latency, and a reservation must never "
        "keep a job from an idle GPU.",
    )

    prepare_ahead: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Jobs a GPU host keeps prepared (export, venv, guard) while its GPU runs one.",
    )

    job_tree_keep_s: float = Field(
        default=24 * 3600,
        ge=0,
        description="How long a GPU host keeps a finished job's exported trees (src, base and "
        "what setup wrote in them) before its worker removes them; logs and results stay.",
    )

    gang_window: int = Field(
        default=8,
        ge=0,
        le=1000,
        description="A job of several GPUs this close behind the one a worker would take, fitting "
        "its host now, goes first (0: line order); app/jobs/gangs.py, Line.gang_ahead.",
    )
    reaper_interval_s: float = Field(default=10.0, gt=0)

    doorbell_stale_s: float = Field(
        default=30.0, gt=0, description="Re-send the doorbell of a job waiting this long."
    )

    job_max_attempts: int = Field(default=3, ge=1)

    max_job_time_limit_s: float = Field(default=24 * 3600, gt=0)

    budget_gpu_hours_per_day: float | None = Field(default=None, gt=0)

    budget_concurrent_gpus: int | None = Field(default=None, ge=1)

    sandbox: Literal["on", "off"] = Field(
        default="on",
        description="Run untrusted code (the agent, pip builds, experiments) under bubblewrap, "
        "each run in its own cgroup. `off` runs it unconfined: only for a machine that has "
        "neither, and every job records it.",
    )

    run_limits: RunLimits = Field(
        default_factory=RunLimits,
        description='Each experiment run\'s limits, JSON: `{"pids": 4096, "memory": "80%"}`; a '
        "key left out keeps its default (app/sandbox/cgroups.py, RunLimits).",
    )

    venv_system_site_packages: bool = Field(
        default=False,
        description="Experiments' venvs reuse the service's site-packages (its torch) when true; "
        "for tests and the demo.",
    )

    venv_root: Path | None = Field(
        default=None, description="Where project venvs are built; default: the state dir."
    )


class CycleSettings(BaseModel):
    """Cycles: how many may be live per project, and how often schedules are checked."""

    max_live_cycles_per_project: int = Field(
        default=20, ge=1, description="A trigger beyond this many unfinished cycles gets 429."
    )

    schedule_tick_s: float = Field(default=60.0, gt=0, description="How often beat checks.")


class LogSettings(BaseModel):
    """Logging."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    log_json: bool = False


class Settings(
    StoreSettings,
    ApiSettings,
    ForgeSettings,
    AgentSettings,
    QueueSettings,
    CycleSettings,
    LogSettings,
    BaseSettings,
):
    """Every setting, each an `AUTOPILOT_<NAME>` variable (one namespace), grouped by domain in
    the classes above."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    def redacted(self) -> dict[str, Any]:
        """The effective settings with every secret hidden: for `config show` and logs."""
        shown: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                shown[name] = "**********" if value.get_secret_value() else ""
            elif isinstance(value, Path):
                shown[name] = str(value)
            elif isinstance(value, BaseModel):  # as its variable takes it: JSON
                shown[name] = value.model_dump_json()
            elif isinstance(value, str) and "://" in value:
                shown[name] = redact_url(value)
            else:
                shown[name] = value
        shown["memory_url"] = redact_url(self.memory_database_url)
        shown["ops_url"] = redact_url(self.ops_database_url)
        return shown


def _base_url(value: str, expected: str) -> str:
    """An http(s) base URL without a trailing '/' or credentials ('' is left to a default):
    these URLs are shown to people and put in pull requests."""
    value = value.strip().rstrip("/")
    if not value:
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected {expected}")
    if parts.username or parts.password:
        raise ValueError(
            "must not hold credentials (tokens have settings of their own, e.g. "
            "AUTOPILOT_CONTROL_TOKEN)"
        )
    return value


def check_control_url(value: str) -> str:
    """The API's base URL as the CLI is given it (`--api`): never empty."""
    expected = "the API's base URL, e.g. http://control.lab:8000"
    checked = _base_url(value, expected)
    if not checked:
        raise ValueError(f"expected {expected}")
    return checked


DOTENV = "the .env file"


def given_settings() -> dict[str, str]:
    """The settings this host sets itself (not defaults), each with where: env or .env file."""
    given = {name: DOTENV for name in DotEnvSettingsSource(Settings)()}
    given.update({name: "the environment" for name in EnvSettingsSource(Settings)()})
    return given


def describe_validation_error(exc: ValidationError) -> list[str]:
    """One line per bad setting, naming the variable and the expected form."""
    lines = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "settings"
        given = error.get("input")
        shown = "" if isinstance(given, dict) else f" (got {redact_text(str(given))[:60]!r})"
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{ENV_PREFIX}{field.upper()}: {message}{shown}")
    return lines


@functools.lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once. Tests build their own `Settings(...)` instead."""
    return Settings()
