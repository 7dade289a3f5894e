"""Logging set-up: one root handler (JSON or text) that masks secrets and carries cycle/job ids.

A leaf: the Celery app, the API and the CLI import it without pulling in FastAPI or Typer.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from app.redaction import redact_text
from app.settings import Settings

_LOG_CONTEXT: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "autopilot_log_context", default=None
)
CONTEXT_KEYS = ("cycle_id", "job_id")
MASK = "***"
_HANDLER_MARK = "_autopilot_handler"


@contextlib.contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Every record logged inside carries these ids (e.g. `log_context(cycle_id=3, job_id=9)`)."""
    unknown = set(ids) - set(CONTEXT_KEYS)
    if unknown:
        raise ValueError(f"unknown log context keys {sorted(unknown)}; use {CONTEXT_KEYS}")
    token = _LOG_CONTEXT.set({**(_LOG_CONTEXT.get() or {}), **ids})
    try:
        yield
    finally:
        _LOG_CONTEXT.reset(token)


def secret_values(settings: Settings) -> list[str]:
    """The values no log line may show: tokens, the session secret, the passwords in the URLs."""
    found: set[str] = set()
    for secret in (
        settings.github_token,
        settings.github_app_private_key,
        settings.session_secret,
        settings.control_token,
        settings.token,
    ):
        if secret is not None and secret.get_secret_value():
            found.add(secret.get_secret_value())
    for url in (settings.memory_database_url, settings.ops_database_url, settings.broker_url):
        try:
            password = urlsplit(url).password
        except ValueError:
            continue
        if password:
            found.update({password, unquote(password)})
    # Very short values would mask ordinary words; URL passwords are also caught by redact_text.
    return sorted((s for s in found if len(s) >= 4), key=len, reverse=True)


class RedactSecrets(logging.Filter):
    """Runs a record's message and traceback through `redact_text` and masks known secrets."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        self.secrets = list(secrets)

    def redact(self, text_: str) -> str:
        text_ = redact_text(text_)
        for secret in self.secrets:
            text_ = text_.replace(secret, MASK)
        return text_

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.redact(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            if isinstance(value, str):
                setattr(record, key, self.redact(value))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and cycle_id/job_id when known."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _LOG_CONTEXT.get() or {}
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            if value is None:
                value = context.get(key)
            if value is not None:
                entry[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, default=str, ensure_ascii=False)


class ContextTextFormatter(logging.Formatter):
    """The plain-text format, with the ids appended when known."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = _LOG_CONTEXT.get() or {}
        ids = []
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            value = context.get(key) if value is None else value
            if value is not None:
                ids.append(f"{key}={value}")
        return f"{line} [{' '.join(ids)}]" if ids else line


def configure_logging(
    settings: Settings, stream: Any = None, loggers: Sequence[str] = ("uvicorn", "celery")
) -> logging.Handler:
    """Install the one root handler (JSON when AUTOPILOT_LOG_JSON, else text) with redaction.

    Idempotent: a second call replaces the handler it installed. The named framework loggers
    lose their own handlers and propagate to ours, so their lines are formatted and masked too.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.addFilter(RedactSecrets(secret_values(settings)))
    handler.setFormatter(
        JsonFormatter()
        if settings.log_json
        else ContextTextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    for name in loggers:
        framework = logging.getLogger(name)
        framework.handlers.clear()
        framework.propagate = True
    return handler
