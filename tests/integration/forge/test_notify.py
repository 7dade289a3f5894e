"""Notifications to a Slack-compatible incoming webhook: a real HTTP receiver on loopback, one
that fails for a while, and one that is down; the cycle settles whatever the receiver does."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from app import notify
from app.cycles import service
from app.cycles.machine import Machine
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings

HOOK_PATH = "/hooks/T000/B000/XXXXsecretpath"
DEADLINE_S = 20.0


@dataclass
class Receiver:
    url: str = ""
    failures: int = 0  # answer 500 to this many posts first
    posts: list[dict[str, Any]] = field(default_factory=list)
    got: threading.Event = field(default_factory=threading.Event)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        receiver = self.server.receiver
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        receiver.posts.append(
            {"path": self.path, "body": body, "type": self.headers["Content-Type"]}
        )
        status = 500 if receiver.failures > 0 else 200
        receiver.failures -= 1
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
        if status == 200:
            receiver.got.set()


class _Server(ThreadingHTTPServer):
    receiver: Receiver
    daemon_threads = True


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.receiver = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}{HOOK_PATH}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def down_url() -> str:
    """The URL of a port nobody listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}{HOOK_PATH}"


def with_notify(settings: Settings, url: str, **more: Any) -> Settings:
    return settings.model_copy(
        update={
            "notify_url": SecretStr(url),
            "notify_attempts": 3,
            "notify_backoff_s": 0.01,
            "notify_timeout_s": 5.0,
            "github_token": SecretStr("ghp_notifyTokenNeverSent0123456789abcdef"),
            **more,
        }
    )


def failing_cycle(settings: Settings, stores: Stores, tmp_path: Path) -> int:
    """A planned cycle of a project whose repository has no autopilot.toml: its plan fails
    for a reason a person must fix."""
    repo = tmp_path / "no-config"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "README.md").write_text("no autopilot.toml here\n")
    subprocess.run([*git, "add", "README.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "start"], check=True)
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="no-config", repo_url=str(repo)))
        cycle, _ = service.create(session, service.Trigger(project="no-config"))
        return cycle.id


def test_a_failed_cycle_is_announced(
    settings: Settings, stores: Stores, tmp_path: Path, receiver: Receiver
) -> None:
    configured = with_notify(settings, receiver.url)
    cycle_id = failing_cycle(configured, stores, tmp_path)
    assert Machine(stores, configured).advance(cycle_id) == "failed"
    assert receiver.got.wait(DEADLINE_S)
    (post,) = receiver.posts
    assert post["path"] == HOOK_PATH and post["type"] == "application/json"
    text = post["body"]["text"]
    assert text.startswith(f"Cycle {cycle_id} of no-config failed: planned: ")
    assert "autopilot.toml" in text and f"/dashboard/cycles/{cycle_id}" in text
    # Advanced again (a duplicate doorbell): no news, no second message.
    assert Machine(stores, configured).advance(cycle_id) == "failed"
    assert notify.NOTIFIER.wait_idle(DEADLINE_S)
    assert len(receiver.posts) == 1


def test_a_receiver_that_fails_for_a_while_is_retried(
    settings: Settings, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.notify")
    receiver.failures = 2
    configured = with_notify(settings, receiver.url)
    token = configured.github_token.get_secret_value()  # type: ignore[union-attr]
    assert notify.announce(
        configured, f"push to https://bot:{token}@github.example/lab/r failed ({token})"
    )
    assert receiver.got.wait(DEADLINE_S) and notify.NOTIFIER.wait_idle(DEADLINE_S)
    assert len(receiver.posts) == 3  # two 500s, then delivered
    text = receiver.posts[-1]["body"]["text"]
    assert token not in text and text == "push to https://bot:***@github.example/lab/r failed (***)"
    assert "given up" not in caplog.text
    assert HOOK_PATH not in caplog.text and token not in caplog.text


def test_a_receiver_that_is_down_is_given_up_and_the_cycle_still_settles(
    settings: Settings, stores: Stores, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.notify")
    configured = with_notify(settings, down_url())
    cycle_id = failing_cycle(configured, stores, tmp_path)
    assert Machine(stores, configured).advance(cycle_id) == "failed"
    assert notify.NOTIFIER.wait_idle(DEADLINE_S)
    tries = [r for r in caplog.records if r.name == "app.notify"]
    assert [r.levelname for r in tries] == ["INFO", "INFO", "WARNING"], caplog.text
    assert tries[-1].getMessage() == "notification given up after 3 tries: ConnectionError"
    assert HOOK_PATH not in caplog.text


def test_nothing_is_sent_without_a_receiver(settings: Settings) -> None:
    assert settings.notify_url is None
    assert notify.announce(settings, "cycle 1 awaits review") is False
