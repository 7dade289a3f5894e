"""An OpenAI-compatible chat-completions server for tests: real HTTP on 127.0.0.1, replies
scripted in order, every request recorded (headers included).

`POST /v1/chat/completions` answers with the real response shape (`chat.completion`, choices,
usage) or, as scripted, an OpenAI-style error body with its status (429 with Retry-After, 400,
500...), or holds the request past the client's timeout. A server that does not support a
`response_format` type is modelled by `rejected_formats`: such a request gets the 400 real
servers send, without using up a scripted reply. Held requests are released on `close()`.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Scripted:
    """One reply: `content` with `usage`, or an error `status` with its `error` body."""

    content: str | None = None
    status: int = 200
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    usage: tuple[int, int] | None = (11, 7)
    finish_reason: str = "stop"
    hold_s: float = 0.0  # wait this long (or until close) before answering


def reply(content: str, prompt_tokens: int = 11, completion_tokens: int = 7) -> Scripted:
    return Scripted(content=content, usage=(prompt_tokens, completion_tokens))


def json_reply(obj: Any, prompt_tokens: int = 11, completion_tokens: int = 7) -> Scripted:
    return reply(json.dumps(obj), prompt_tokens, completion_tokens)


def no_usage(content: str) -> Scripted:
    return Scripted(content=content, usage=None)


def rate_limited(retry_after: str | None = "0.1") -> Scripted:
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return Scripted(
        status=429,
        headers=headers,
        error={
            "message": "Rate limit reached for requests. Please try again later.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        },
    )


def server_error(status: int = 400, message: str = "bad request") -> Scripted:
    return Scripted(
        status=status,
        error={"message": message, "type": "invalid_request_error", "param": None, "code": None},
    )


def held(seconds: float, then: Scripted | None = None) -> Scripted:
    """A request held `seconds` (past the client's timeout) before it is answered with `then`."""
    base = then or reply("{}")
    return Scripted(**{**base.__dict__, "hold_s": seconds})


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]  # names in lower case
    body: dict[str, Any]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def response_format(self) -> str | None:
        fmt = self.body.get("response_format")
        return fmt.get("type") if isinstance(fmt, dict) else None


class LLMServer:
    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.rejected_formats: set[str] = set()
        self.requests: list[Recorded] = []
        self._script: collections.deque[Scripted] = collections.deque()
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def script(self, *replies: Scripted) -> None:
        with self._lock:
            self._script.extend(replies)

    @property
    def left(self) -> int:
        with self._lock:
            return len(self._script)

    def close(self) -> None:
        self._released.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def _next(self, body: dict[str, Any]) -> Scripted:
        fmt = body.get("response_format")
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind in self.rejected_formats:
            # What vLLM / llama.cpp servers say when they cannot honour the format.
            return server_error(
                400, f"response_format type '{kind}' is not supported by this server"
            )
        with self._lock:
            if not self._script:
                return server_error(400, "llm_server: no scripted reply left")
            return self._script.popleft()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode(errors="replace")}
                with server._lock:
                    server.requests.append(
                        Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if server.api_key is not None and self.headers.get("authorization") != (
                    f"Bearer {server.api_key}"
                ):
                    self._send(401, {"error": {"message": "Incorrect API key provided",
                                               "type": "invalid_request_error",
                                               "code": "invalid_api_key", "param": None}})  # fmt: skip
                    return
                if not isinstance(body.get("messages"), list) or not body.get("model"):
                    self._send(400, {"error": {"message": "'model' and 'messages' are required"}})
                    return
                scripted = server._next(body)
                if scripted.hold_s:
                    server._released.wait(scripted.hold_s)
                if scripted.status != 200:
                    self._send(scripted.status, {"error": scripted.error}, scripted.headers)
                    return
                completion: dict[str, Any] = {
                    "id": f"chatcmpl-{len(server.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": scripted.content},
                            "logprobs": None,
                            "finish_reason": scripted.finish_reason,
                        }
                    ],
                }
                if scripted.usage is not None:
                    prompt, done = scripted.usage
                    completion["usage"] = {
                        "prompt_tokens": prompt,
                        "completion_tokens": done,
                        "total_tokens": prompt + done,
                    }
                self._send(200, completion, scripted.headers)

            def _send(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout) while the request was held

        return Handler


@contextmanager
def llm_server(api_key: str | None = None) -> Iterator[LLMServer]:
    server = LLMServer(api_key)
    try:
        yield server
    finally:
        server.close()
