"""Server-sent-event streams (the dashboard's live pages, a job's followed log) through
sse-starlette: a ping every 15 s, a send timeout for a client that stopped reading, every stream
ended at once when the server shuts down (so an open tab never holds `autopilot serve` up), and
at most AUTOPILOT_MAX_STREAMS_PER_TOKEN open streams per token in this process.

The generators yield SSE text already framed (`data: ...\\n\\n`); it passes through as bytes.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse

from app.errors import AutopilotError

PING_S = 15
SEND_TIMEOUT_S = 30.0
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class TooManyStreams(AutopilotError):
    status = 429
    slug = "too-many-streams"
    title = "Too many open streams"


class _Slots:
    def __init__(self) -> None:
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, owner: str, limit: int) -> None:
        with self._lock:
            if self._open[owner] >= limit:
                raise TooManyStreams(
                    f"token {owner!r} has {self._open[owner]} streams open (limit {limit}, "
                    "AUTOPILOT_MAX_STREAMS_PER_TOKEN); close a tab or a follower first"
                )
            self._open[owner] += 1

    def give(self, owner: str) -> None:
        with self._lock:
            self._open[owner] -= 1
            if self._open[owner] <= 0:
                del self._open[owner]

    def open(self, owner: str) -> int:
        with self._lock:
            return self._open[owner]


slots = _Slots()


def event_stream(chunks: AsyncIterator[str], *, owner: str, limit: int) -> EventSourceResponse:
    """The response that sends `chunks`, counted against `owner`'s open streams; TooManyStreams
    (429) when it has `limit` open already."""
    slots.take(owner, limit)

    async def framed() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk.encode()
        finally:
            slots.give(owner)

    return EventSourceResponse(framed(), ping=PING_S, send_timeout=SEND_TIMEOUT_S, headers=HEADERS)
