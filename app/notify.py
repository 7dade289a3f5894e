"""Notifications to people: a Slack- or Mattermost-compatible incoming webhook
(AUTOPILOT_NOTIFY_URL, a POST of `{"text": ...}`) told when a cycle awaits review or failed.

Sent off the cycle's path: `announce` queues the text and returns; one background thread per
process posts it, retrying a receiver that is down or answers an error with backoff
(AUTOPILOT_NOTIFY_BACKOFF_S, doubled each time) and giving up after AUTOPILOT_NOTIFY_ATTEMPTS
tries with a log line. A notification still queued when the process ends is lost: it is a
courtesy, the dashboard's queue is the record. No secret goes out: the text is redacted (URL
credentials and every secret setting), and the receiver's URL, itself a secret, is never logged.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import requests
from pydantic import SecretStr

from app.redaction import redact_text
from app.settings import Settings

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 3000  # Slack shows about this much of a message before "show more"
MAX_QUEUED = 1000  # beyond this, a notification is dropped (logged) rather than held


@dataclass(frozen=True)
class Notice:
    url: str
    text: str
    attempts: int
    backoff_s: float
    timeout_s: float


def redact_secrets(settings: Settings, text: str) -> str:
    """`text` with URL credentials and the value of every secret setting hidden."""
    text = redact_text(text)
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr) and (secret := value.get_secret_value()):
            text = text.replace(secret, "***")
    return text


class Notifier:
    """The process's sender: a queue and one daemon thread, started at the first notice."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Notice] = queue.Queue(MAX_QUEUED)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._pending = 0
        self._stop = threading.Event()  # only shortens a backoff (tests, shutdown)

    def submit(self, notice: Notice) -> bool:
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait(notice)
        except queue.Full:
            self._done()
            log.warning("notification dropped: %d are waiting already", MAX_QUEUED)
            return False
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
                self._thread.start()
        return True

    def wait_idle(self, timeout: float) -> bool:
        """Whether every submitted notice was delivered or given up within `timeout`."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _done(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def _run(self) -> None:
        while True:
            notice = self._queue.get()
            try:
                deliver(notice, self._stop.wait)
            except Exception:  # a bug here must not end the thread for the next notices
                log.exception("notification failed")
            finally:
                self._done()


def deliver(notice: Notice, pause: Callable[[float], object] | None = None) -> bool:
    """POST one notice, retrying with backoff (`pause` waits it out); False, and a log line,
    when given up."""
    pause = pause or threading.Event().wait
    delay = notice.backoff_s
    why = ""
    for attempt in range(1, notice.attempts + 1):
        try:
            answer = requests.post(notice.url, json={"text": notice.text}, timeout=notice.timeout_s)
            if 200 <= answer.status_code < 300:
                return True
            why = f"the receiver answered {answer.status_code}"
        except requests.RequestException as exc:
            why = type(exc).__name__  # its message holds the URL, a secret
        if attempt < notice.attempts:
            log.info("notification try %d failed (%s); next in %.3g s", attempt, why, delay)
            pause(delay)
            delay *= 2
    log.warning("notification given up after %d tries: %s", notice.attempts, why)
    return False


NOTIFIER = Notifier()


def announce(settings: Settings, text: str) -> bool:
    """Queue `text` for the configured receiver (none configured: nothing is sent); never
    blocks on the receiver. Returns whether it was queued."""
    url = settings.notify_url.get_secret_value() if settings.notify_url is not None else ""
    if not url:
        return False
    safe = redact_secrets(settings, text)
    if len(safe) > MAX_TEXT_CHARS:
        safe = safe[: MAX_TEXT_CHARS - 1] + "…"
    return NOTIFIER.submit(
        Notice(
            url=url,
            text=safe,
            attempts=settings.notify_attempts,
            backoff_s=settings.notify_backoff_s,
            timeout_s=settings.notify_timeout_s,
        )
    )
