"""Per-route request metrics (count by status, latency histogram) for `/metrics`: an ASGI
middleware that labels each request by its route's template (`/api/v1/cycles/{cycle_id}`), never
by the raw path, so the series stay few."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.status import HTTP_LATENCY, HTTP_REQUESTS

UNMATCHED = "unmatched"


class RequestMetrics:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route, method = _route(scope), str(scope.get("method", ""))
            HTTP_REQUESTS.labels(method, route, str(status)).inc()
            HTTP_LATENCY.labels(method, route).observe(time.perf_counter() - started)


def _route(scope: Scope) -> str:
    """The template of the route that served the request (`/api/v1/cycles/{cycle_id}`): the
    router leaves the route in the scope, its template relative to the router that holds it, so
    the path's leading segments before it are the routers' prefixes."""
    route = scope.get("route")
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    if not template:
        return UNMATCHED
    template = str(template)
    segments = str(scope.get("path", "")).split("/")
    own = template.split("/")
    if ":path}" in template or len(own) > len(segments):
        return template  # a path parameter spans segments: the template alone
    return "/".join(segments[: len(segments) - len(own) + 1]) + template
