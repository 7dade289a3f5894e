"""Request size limit: a body larger than the limit is refused with 413 before it is read whole.

A small limit for every request (AUTOPILOT_MAX_REQUEST_BYTES, 1 MiB), except the routes given
their own: a memory import, a job's whole log (uploaded in one request), and the git endpoint.
Starlette 1.x has a limit of its own (`max_body_size`, per app or route), but it answers 413 in
plain text where every error here is problem+json, and the FastAPI floor in pyproject.toml
(0.110) predates it; so this middleware counts the body as it arrives.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import PROBLEM_BASE

#: What a memory import's multipart form adds to its file (boundaries, the other fields).
IMPORT_FORM_BYTES = 1024 * 1024
#: A git client's fetch negotiation (want/have lines) on the forge's smart-HTTP endpoint.
GIT_REQUEST_BYTES = 16 * 1024 * 1024


class BodySizeLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, routes: Mapping[str, int] | None = None
    ) -> None:
        """`routes`: a path pattern (the whole path must match) to the limit of its bodies."""
        self.app = app
        self.max_bytes = max_bytes
        self.routes = [(re.compile(pattern), limit) for pattern, limit in (routes or {}).items()]

    def limit(self, path: str) -> int:
        for pattern, limit in self.routes:
            if pattern.fullmatch(path):
                return limit
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.limit(scope.get("path", ""))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self._refuse(send, max_bytes)
            return
        seen = 0
        refused = started = False

        async def limited() -> Message:
            # A chunked body has no declared length: count it as it arrives. On overflow the 413
            # goes out from here and the app sees a disconnect; raising instead would surface
            # inside the framework's body parsing as a 400 "error parsing the body".
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    refused = True
                    if not started:
                        await self._refuse(send, max_bytes)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 is the answer; what the app says after the disconnect is dropped
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, guarded)
        except Exception:
            if not refused:  # after a refusal the app's error is the disconnect's echo
                raise

    async def _refuse(self, send: Send, max_bytes: int) -> None:
        body = (
            b'{"type":"' + PROBLEM_BASE.encode() + b'too-large","title":"Request too large",'
            b'"status":413,"detail":"the request body exceeds '
            + str(max_bytes).encode()
            + b' bytes"}'
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
