"""A small GitHub REST server for tests: the endpoints GitHubForge uses, as GitHub documents them.

GET /repos/{o}/{r}; GET/POST /repos/{o}/{r}/pulls (state/head/base filters, per_page/page with
Link headers); GET/PATCH /repos/{o}/{r}/pulls/{n}; PUT /repos/{o}/{r}/pulls/{n}/merge;
GET/POST /repos/{o}/{r}/issues/{n}/comments. Faults are queued per (method, route).
"""

from __future__ import annotations

import json
import re
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

PREFIX = "/api/v3"


@dataclass
class Fault:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    apply_first: bool = False  # do the real work, then answer with the fault (a lost answer)


@dataclass
class FakeGitHub:
    owner: str = "lab"
    repo: str = "research"
    base_url: str = ""
    pulls: list[dict[str, Any]] = field(default_factory=list)
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    faults: dict[tuple[str, str], list[Fault]] = field(default_factory=lambda: defaultdict(list))
    requests: list[tuple[str, str]] = field(default_factory=list)
    auth_headers: list[str] = field(default_factory=list)
    hide_from_list: int = 0  # list answers that lag behind (eventual consistency)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def repo_url(self) -> str:
        return f"{self.base_url}/repos/{self.owner}/{self.repo}"

    def add_pull(self, head: str, base: str = "main", state: str = "open") -> dict[str, Any]:
        number = len(self.pulls) + 1
        url = f"{self.repo_url()}/pulls/{number}"
        pr = {
            "id": 1000 + number,
            "number": number,
            "state": state,
            "title": f"PR {number}",
            "body": "",
            "merged": False,
            "merge_commit_sha": None,
            "mergeable": True,
            "url": url,
            "html_url": f"https://github.example/{self.owner}/{self.repo}/pull/{number}",
            "issue_url": f"{self.repo_url()}/issues/{number}",
            "comments_url": f"{self.repo_url()}/issues/{number}/comments",
            "head": {"ref": head, "sha": f"{number:040x}", "label": f"{self.owner}:{head}"},
            "base": {"ref": base, "sha": "b" * 40, "label": f"{self.owner}:{base}"},
        }
        self.pulls.append(pr)
        return pr


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}") if length else {}

    def _route(self, method: str) -> None:
        gh = self.server.fake
        parts = urlsplit(self.path)
        path = parts.path.removeprefix(PREFIX)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        body = self._body() if method in ("POST", "PATCH", "PUT") else {}
        base = f"/repos/{gh.owner}/{gh.repo}"
        route = re.sub(r"/\d+", "/{n}", path.removeprefix(base)) or "/"
        with gh.lock:
            gh.requests.append((method, route))
            gh.auth_headers.append(self.headers.get("Authorization", ""))
            queued = gh.faults.get((method, route))
            fault = queued.pop(0) if queued else None
        if fault and not fault.apply_first:
            return self._send(fault.status, fault.body, fault.headers)
        if not path.startswith(base):
            return self._send(404, {"message": "Not Found"})
        status, answer, headers = self._handle(method, route, path.removeprefix(base), query, body)
        if fault:
            return self._send(fault.status, fault.body, fault.headers)
        return self._send(status, answer, headers)

    def _page(
        self, items: list[Any], query: dict[str, str], path: str
    ) -> tuple[int, Any, dict[str, str]]:
        per_page = int(query.get("per_page", 30))
        page = int(query.get("page", 1))
        chunk = items[(page - 1) * per_page : page * per_page]
        headers = {}
        if page * per_page < len(items):
            nxt = {**query, "page": str(page + 1)}
            link = f"{self.server.fake.base_url.removesuffix(PREFIX)}{path}?{urlencode(nxt)}"
            headers["Link"] = f'<{link}>; rel="next"'
        return 200, chunk, headers

    def _handle(
        self, method: str, route: str, rest: str, query: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, Any, dict[str, str]]:
        gh = self.server.fake
        full = f"/repos/{gh.owner}/{gh.repo}"
        if route == "/" and method == "GET":
            return (
                200,
                {
                    "id": 1,
                    "name": gh.repo,
                    "full_name": f"{gh.owner}/{gh.repo}",
                    "owner": {"login": gh.owner, "id": 7},
                    "url": gh.repo_url(),
                    "html_url": f"https://github.example/{gh.owner}/{gh.repo}",
                    "default_branch": "main",
                },
                {},
            )
        if route == "/pulls" and method == "GET":
            items = [p for p in gh.pulls if query.get("state", "open") in ("all", p["state"])]
            if "head" in query:
                items = [p for p in items if p["head"]["label"] == query["head"]]
            if "base" in query:
                items = [p for p in items if p["base"]["ref"] == query["base"]]
            if gh.hide_from_list > 0:
                gh.hide_from_list -= 1
                items = []
            return self._page(items, query, PREFIX + full + "/pulls")
        if route == "/pulls" and method == "POST":
            if not body.get("head") or not body.get("base"):
                return 422, {"message": "Validation Failed"}, {}
            label = f"{gh.owner}:{body['head']}"
            for p in gh.pulls:
                if (
                    p["state"] == "open"
                    and p["head"]["label"] == label
                    and p["base"]["ref"] == body["base"]
                ):
                    return (
                        422,
                        {
                            "message": "Validation Failed",
                            "errors": [
                                {
                                    "resource": "PullRequest",
                                    "code": "custom",
                                    "message": f"A pull request already exists for {label}.",
                                }
                            ],
                            "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request",
                        },
                        {},
                    )
            pr = gh.add_pull(body["head"], body["base"])
            pr.update(title=body.get("title", ""), body=body.get("body", ""))
            return 201, pr, {}
        match = re.fullmatch(r"/pulls/(\d+)(/merge)?|/issues/(\d+)/comments", rest)
        if not match:
            return 404, {"message": "Not Found"}, {}
        number = int(match.group(1) or match.group(3))
        if number > len(gh.pulls):
            return 404, {"message": "Not Found"}, {}
        pr = gh.pulls[number - 1]
        if route == "/pulls/{n}" and method == "GET":
            return 200, pr, {}
        if route == "/pulls/{n}" and method == "PATCH":
            if "state" in body:
                pr["state"] = body["state"]
            return 200, pr, {}
        if route == "/pulls/{n}/merge" and method == "PUT":
            if pr["merged"] or pr["state"] != "open":
                return 405, {"message": "Pull Request is not mergeable"}, {}
            if body.get("sha") and body["sha"] != pr["head"]["sha"]:
                return (
                    409,
                    {"message": "Head branch was modified. Review and try the merge again."},
                    {},
                )
            pr.update(merged=True, state="closed", merge_commit_sha="m" * 40)
            return (
                200,
                {"sha": "m" * 40, "merged": True, "message": "Pull Request successfully merged"},
                {},
            )
        if route == "/issues/{n}/comments" and method == "POST":
            comment = {
                "id": 5000 + len(gh.comments[number]),
                "body": body["body"],
                "url": f"{gh.repo_url()}/issues/comments/1",
            }
            gh.comments[number].append(comment)
            return 201, comment, {}
        if route == "/issues/{n}/comments" and method == "GET":
            return self._page(
                gh.comments[number], query, PREFIX + full + f"/issues/{number}/comments"
            )
        return 404, {"message": "Not Found"}, {}

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def do_PUT(self) -> None:
        self._route("PUT")


class _Server(ThreadingHTTPServer):
    fake: FakeGitHub
    daemon_threads = True


@contextmanager
def serve() -> Iterator[FakeGitHub]:
    server = _Server(("127.0.0.1", 0), _Handler)
    fake = FakeGitHub()
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}{PREFIX}"
    server.fake = fake
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
