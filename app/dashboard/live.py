"""Live parts of the dashboard: a server-sent-events stream that says when a page is stale.

A live page (cycles, a running cycle or campaign, the GPU queue, the review queue) carries the
*version* of what it shows: a short hash of the ops rows it depends on (counts and latest
timestamps). Its script subscribes to `/dashboard/live/<topic>`; the stream polls that version
once a second and sends `event: changed` when it moves, and the page then fetches itself and
swaps its `<main>`. The stream carries no data, only "look again": what a reader may see stays
decided by the page routes and their checks. Without JavaScript the pages fall back to a
periodic reload.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from sqlalchemy.orm import Session

from app.cycles import service as cycles
from app.cycles.campaigns import lifecycle as campaign_lifecycle
from app.cycles.campaigns import service as campaigns
from app.db import Stores
from app.jobs import figures

#: A campaign's states while its driver still moves it.
CAMPAIGN_LIVE = campaign_lifecycle.LIVE


def live_campaigns(session: Session) -> list[tuple[object, ...]]:
    """Each live campaign's state and last move: a campaign moves when one of its cycles
    settles, and once more on its own as it ends (then it leaves this list)."""
    return [
        (c.id, c.state, c.updated_at)
        for state in CAMPAIGN_LIVE
        for c in campaigns.list_campaigns(session, state=state)
    ]


#: What each topic's pages show, as the marks (counts, latest times) of the rows whose change
#: makes them stale.
TOPICS: dict[str, Callable[[Session], list[tuple[object, ...]]]] = {
    # cycles list, a cycle's page, the review queue, the campaigns and a campaign's page
    "cycles": lambda session: [
        *cycles.change_marks(session),
        figures.change_marks(session),
        *live_campaigns(session),
    ],
    # the GPU queue: jobs, who holds them, the workers (not heartbeats: every running job
    # would then make every open queue page fetch itself once a second)
    "queue": lambda session: [figures.change_marks(session), *figures.holder_marks(session)],
}

POLL_S = 1.0
KEEPALIVE_S = 15.0
#: A stream ends after this long; EventSource reconnects on its own (with Last-Event-ID).
MAX_STREAM_S = 300.0
RETRY_MS = 3000


def version(stores: Stores, topic: str) -> str:
    """The version of what `topic`'s pages show (16 hex digits)."""
    with stores.ops_session() as session:
        parts = TOPICS[topic](session)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


class _Shared:
    """One version read per topic and interval, whatever the number of open streams."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, str], tuple[float, str]] = {}
        self._lock = threading.Lock()

    def version(self, stores: Stores, topic: str, max_age_s: float) -> str:
        key = (id(stores), topic)
        now = time.monotonic()
        with self._lock:
            cached = self._seen.get(key)
            if cached is not None and now - cached[0] < max_age_s:
                return cached[1]
        current = version(stores, topic)
        with self._lock:
            self._seen[key] = (now, current)
        return current


_shared = _Shared()


async def stream(
    stores: Stores,
    topic: str,
    since: str | None,
    is_disconnected: Callable[[], Any],
    *,
    poll_s: float = POLL_S,
    max_s: float = MAX_STREAM_S,
) -> AsyncIterator[str]:
    """`event: changed` each time the topic's version moves away from the last one sent."""
    yield f"retry: {RETRY_MS}\n\n"
    last = since
    elapsed = since_keepalive = 0.0
    while elapsed < max_s:
        if await is_disconnected():
            return
        try:
            current = await anyio.to_thread.run_sync(_shared.version, stores, topic, poll_s * 0.9)
        except Exception:  # the ops DB is unreachable: end; the browser retries later
            return
        if current != last:
            if last is not None:
                yield f"id: {current}\nevent: changed\ndata: {current}\n\n"
                since_keepalive = 0.0
            last = current
        elif since_keepalive >= KEEPALIVE_S:
            yield ": keep-alive\n\n"
            since_keepalive = 0.0
        await anyio.sleep(poll_s)
        elapsed += poll_s
        since_keepalive += poll_s
