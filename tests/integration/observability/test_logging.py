"""Structured logs: one JSON object per line, cycle and job ids attached, secrets never shown."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.logs import configure_logging, log_context
from app.settings import Settings

GITHUB_TOKEN = "ghp_S3cretTokenValue0123456789abcdef"
SESSION_SECRET = "session-secret-value-42"
DB_PASSWORD = "pg-p@ss/w0rd"  # characters that must be percent-encoded in a URL
REDIS_PASSWORD = "redis-pw-9876"


@pytest.fixture
def captured(tmp_path: Path) -> Iterator[io.StringIO]:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=tmp_path,
        log_json=True,
        github_token=GITHUB_TOKEN,
        session_secret=SESSION_SECRET,
        ops_url="postgresql+psycopg://autopilot:pg-p%40ss%2Fw0rd@db:5432/autopilot_ops",
        memory_url="postgresql+psycopg://autopilot:pg-p%40ss%2Fw0rd@db:5432/autopilot_memory",
        broker_url=f"redis://:{REDIS_PASSWORD}@redis:6379/0",
    )
    stream = io.StringIO()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    handler = configure_logging(settings, stream=stream)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.handlers[:] = handlers
        root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_object_per_line_with_ids(captured: io.StringIO) -> None:
    log = logging.getLogger("app.cycles.test")
    log.info("plain line")
    log.warning("with extra", extra={"cycle_id": 7, "job_id": 42})
    with log_context(cycle_id=3):
        log.info("in a cycle")
        with log_context(job_id=11):
            log.error("in a job of the cycle")
    log.info("after")

    plain, extra, cycle, job, after = lines(captured)
    assert set(plain) == {"time", "level", "logger", "message"}
    assert (plain["level"], plain["logger"], plain["message"]) == (
        "INFO",
        "app.cycles.test",
        "plain line",
    )
    assert (extra["cycle_id"], extra["job_id"]) == (7, 42)
    assert cycle["cycle_id"] == 3 and "job_id" not in cycle
    assert (job["cycle_id"], job["job_id"], job["level"]) == (3, 11, "ERROR")
    assert "cycle_id" not in after


def test_secrets_are_masked_in_messages_args_and_tracebacks(captured: io.StringIO) -> None:
    log = logging.getLogger("app.forge.test")
    log.info("pushing with token %s", GITHUB_TOKEN)
    log.info("cookie signed with %s", SESSION_SECRET)
    log.info("connecting to postgresql+psycopg://autopilot:pg-p%40ss%2Fw0rd@db:5432/x")
    log.info(
        "raw password %s and broker %s", DB_PASSWORD, f"redis://:{REDIS_PASSWORD}@redis:6379/0"
    )
    log.info("git remote https://x-access-token:other-token-xyz@github.com/lab/repo.git")
    try:
        raise RuntimeError(f"push failed: {GITHUB_TOKEN}")
    except RuntimeError:
        log.exception("forge error")

    text = captured.getvalue()
    for secret in (GITHUB_TOKEN, SESSION_SECRET, DB_PASSWORD, "pg-p%40ss%2Fw0rd", REDIS_PASSWORD):
        assert secret not in text, secret
    assert "other-token-xyz" not in text  # any URL's userinfo, known secret or not
    records = lines(captured)
    assert records[0]["message"] == "pushing with token ***"
    assert "x-access-token:***@github.com" in str(records[4]["message"])
    assert "RuntimeError: push failed: ***" in str(records[5]["exc"])


def test_framework_loggers_go_through_the_same_handler(captured: io.StringIO) -> None:
    logging.getLogger("uvicorn.error").warning("started with %s", SESSION_SECRET)
    (record,) = lines(captured)
    assert record["logger"] == "uvicorn.error"
    assert record["message"] == "started with ***"


def test_text_mode_also_redacts(tmp_path: Path) -> None:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=tmp_path,
        github_token=GITHUB_TOKEN,
    )
    stream = io.StringIO()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    handler = configure_logging(settings, stream=stream)
    try:
        with log_context(job_id=5):
            logging.getLogger("workers.gpu").info("token %s", GITHUB_TOKEN)
    finally:
        root.removeHandler(handler)
        root.handlers[:] = handlers
        root.setLevel(level)
    out = stream.getvalue()
    assert GITHUB_TOKEN not in out
    assert "token ***" in out and out.rstrip().endswith("[job_id=5]")


def test_log_context_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown log context keys"), log_context(user="x"):
        pass
