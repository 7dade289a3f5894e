"""Live parts: pages carry their topic's version; the event stream says when it moved."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient

from app.cycles.models import Cycle
from app.dashboard import live
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.integration.dashboard.conftest import login

VERSION = re.compile(r'data-live-url="([^"]+)" data-version="([0-9a-f]{16})"')


def add_cycle(stores: Stores, state: str = "planned") -> int:
    with stores.ops_session() as session:
        project = ops.create_project(session, ProjectCreate(name="live-probe", repo_url="/nowhere"))
        cycle = Cycle(project_id=project.id, state=state, agent="sweep")
        session.add(cycle)
        session.flush()
        return cycle.id


def test_live_pages_carry_their_stream_and_version(
    client: TestClient, tokens: dict[str, str], stores: Stores
) -> None:
    login(client, tokens["reader"])
    pages = {"/dashboard/": "cycles", "/dashboard/cycles": "cycles", "/dashboard/queue": "queue"}
    before = {}
    for path, topic in pages.items():
        match = VERSION.search(client.get(path).text)
        assert match, path
        assert match.group(1) == f"/dashboard/live/{topic}"
        assert match.group(2) == live.version(stores, topic)
        before[path] = match.group(2)
    add_cycle(stores)
    after = VERSION.search(client.get("/dashboard/cycles").text)
    assert after and after.group(2) != before["/dashboard/cycles"]
    # Memory pages show nothing that moves on its own: no stream.
    assert "data-live-url" not in client.get("/dashboard/memory").text


def test_the_stream_needs_a_session_and_a_known_topic(
    client: TestClient, tokens: dict[str, str]
) -> None:
    assert client.get("/dashboard/live/cycles").status_code == 401
    login(client, tokens["reader"])
    missing = client.get("/dashboard/live/secrets")
    assert missing.status_code == 404 and "one of cycles, queue" in missing.text


def run_in_own_loop(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `body` on an event loop of its own thread: the browser tests' Playwright keeps a
    loop running on the main thread for the whole session."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            anyio.run(body)
        except BaseException as exc:  # re-raised in the test's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="live-stream-test")
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the stream test did not finish in 60 s"
    if failure:
        raise failure[0]


def test_the_stream_says_changed_when_a_cycle_moves(stores: Stores) -> None:
    since = live.version(stores, "cycles")

    async def connected() -> bool:
        return False

    async def body() -> None:
        events = live.stream(stores, "cycles", since, connected, poll_s=0.01, max_s=30)
        assert await anext(events) == "retry: 3000\n\n"
        cycle_id = await anyio.to_thread.run_sync(add_cycle, stores)
        with anyio.fail_after(20):
            changed = await anext(events)
        moved = live.version(stores, "cycles")
        assert changed == f"id: {moved}\nevent: changed\ndata: {moved}\n\n"
        with stores.ops_session() as session:
            cycle = session.get(Cycle, cycle_id)
            assert cycle is not None
            cycle.state = "preparing"
            cycle.updated_at = cycle.updated_at.replace(year=cycle.updated_at.year + 1)
        with anyio.fail_after(20):
            again = await anext(events)
        assert again.startswith("id: ") and moved not in again
        await events.aclose()  # type: ignore[attr-defined]

    run_in_own_loop(body)


def test_a_stale_version_is_told_at_once_and_a_disconnect_ends_the_stream(
    stores: Stores,
) -> None:
    gone = False

    async def disconnected() -> bool:
        return gone

    async def body() -> None:
        nonlocal gone
        events = live.stream(stores, "queue", "0" * 16, disconnected, poll_s=0.01, max_s=30)
        assert await anext(events) == "retry: 3000\n\n"
        with anyio.fail_after(20):
            assert "event: changed" in await anext(events)
        gone = True
        with anyio.fail_after(20), pytest.raises(StopAsyncIteration):
            await anext(events)

    run_in_own_loop(body)
