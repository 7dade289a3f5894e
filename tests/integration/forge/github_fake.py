"""A small GitHub REST server for tests: the endpoints GitHubForge uses, as GitHub documents them.

GET /repos/{o}/{r}; GET/POST /repos/{o}/{r}/pulls (state/head/base filters, per_page/page with
Link headers); GET/PATCH /repos/{o}/{r}/pulls/{n}; PUT /repos/{o}/{r}/pulls/{n}/merge;
GET /repos/{o}/{r}/pulls/{n}/reviews; GET /repos/{o}/{r}/issues/{n} (with `closed_by`);
GET/POST /repos/{o}/{r}/issues/{n}/comments; GET /repos/{o}/{r}/collaborators/{u}/permission;
GET /repos/{o}/{r}/commits/{sha}; POST /repos/{o}/{r}/statuses/{sha}. Faults are queued per (method, route).

What people do on github.com (merge, close, review, comment) is done with the `*_on_github`
helpers, which change the fake's state as GitHub would; `webhook_payload` builds the delivery
GitHub would send for it, shaped as GitHub's webhook documentation shows.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
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
    reviews: dict[int, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    closed_by: dict[int, dict[str, Any]] = field(default_factory=dict)
    # login -> permission (admin, write, read, none); anyone else reads (a public repository)
    permissions: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    # Called (method, route) after a request's work is done, before its answer goes out: what
    # GitHub does meanwhile (a webhook delivery it sends when a PR closes).
    after: dict[tuple[str, str], Callable[[], None]] = field(default_factory=dict)
    bot: str = "autopilot-bot"  # the login the token acts as
    clock: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def now(self) -> str:
        """A GitHub timestamp, later at each call (a fake clock, no waiting)."""
        seconds = next(self.clock)
        return f"2026-12-05T12:{seconds // 60:02d}:{seconds % 60:02d}Z"

    @staticmethod
    def user(login: str) -> dict[str, Any]:
        return {"login": login, "id": abs(hash(login)) % 10**6, "type": "User"}

    def merge_on_github(self, number: int, by: str) -> dict[str, Any]:
        pr = self.pulls[number - 1]
        pr.update(
            state="closed",
            merged=True,
            merged_by=self.user(by),
            merge_commit_sha="e" * 40,
            closed_at=self.now(),
        )
        self.closed_by[number] = self.user(by)
        return pr

    def close_on_github(self, number: int, by: str) -> dict[str, Any]:
        pr = self.pulls[number - 1]
        pr.update(state="closed", closed_at=self.now())
        self.closed_by[number] = self.user(by)
        return pr

    def review_on_github(self, number: int, by: str, state: str, body: str) -> dict[str, Any]:
        """`state` as the REST API writes it: APPROVED, CHANGES_REQUESTED, COMMENTED."""
        review = {
            "id": 8000 + sum(len(r) for r in self.reviews.values()),
            "user": self.user(by),
            "body": body,
            "state": state,
            "commit_id": self.pulls[number - 1]["head"]["sha"],
            "submitted_at": self.now(),
            "author_association": "MEMBER",
        }
        self.reviews[number].append(review)
        return review

    def comment_on_github(self, number: int, by: str, body: str) -> dict[str, Any]:
        comment = {
            "id": 5000 + sum(len(c) for c in self.comments.values()),
            "body": body,
            "user": self.user(by),
            "created_at": self.now(),
            "url": f"{self.repo_url()}/issues/comments/1",
            "author_association": "MEMBER",
        }
        self.comments[number].append(comment)
        return comment

    def repository_payload(self) -> dict[str, Any]:
        return {
            "id": 1,
            "name": self.repo,
            "full_name": f"{self.owner}/{self.repo}",
            "owner": self.user(self.owner),
            "private": True,
            "html_url": f"https://github.example/{self.owner}/{self.repo}",
        }

    def webhook_payload(self, event: str, number: int, **what: Any) -> dict[str, Any]:
        """The payload GitHub sends for `event` on PR `number`: pull_request (`action`),
        pull_request_review (`review`), issue_comment (`comment`), with `sender`."""
        pr = self.pulls[number - 1]
        sender = self.user(what.get("sender", self.owner))
        repository = self.repository_payload()
        if event == "pull_request":
            return {
                "action": what.get("action", "closed"),
                "number": number,
                "pull_request": pr,
                "repository": repository,
                "sender": sender,
            }
        if event == "pull_request_review":
            review = dict(what["review"])
            review["state"] = review["state"].lower()  # webhooks write it in lower case
            return {
                "action": "submitted",
                "review": review,
                "pull_request": pr,
                "repository": repository,
                "sender": review["user"],
            }
        if event == "issue_comment":
            issue = {
                "number": number,
                "title": pr["title"],
                "state": pr["state"],
                "pull_request": {"url": pr["url"], "html_url": pr["html_url"]},
                "user": self.user(self.bot),
            }
            comment = what["comment"]
            return {
                "action": "created",
                "issue": issue,
                "comment": comment,
                "repository": repository,
                "sender": comment["user"],
            }
        raise ValueError(event)

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
            "merged_by": None,
            "merge_commit_sha": None,
            "closed_at": None,
            "user": self.user(self.bot),
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
        if (then := gh.after.get((method, route))) is not None:
            then()
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
        permission = re.fullmatch(r"/collaborators/([A-Za-z0-9-]+)/permission", rest)
        if permission and method == "GET":
            login = permission.group(1)
            level = gh.permissions.get(login, "read")
            return 200, {"permission": level, "role_name": level, "user": gh.user(login)}, {}
        commit = re.fullmatch(r"/commits/([0-9a-f]{40})", rest)
        if commit and method == "GET":
            sha = commit.group(1)
            if sha not in {p["head"]["sha"] for p in gh.pulls}:
                return 422, {"message": f"No commit found for SHA: {sha}"}, {}
            return (
                200,
                {
                    "sha": sha,
                    "url": f"{gh.repo_url()}/commits/{sha}",
                    "html_url": f"https://github.example/{gh.owner}/{gh.repo}/commit/{sha}",
                    "commit": {"message": "results", "tree": {"sha": "d" * 40}},
                    "parents": [],
                },
                {},
            )
        status = re.fullmatch(r"/statuses/([0-9a-f]{40})", rest)
        if status and method == "POST":
            if body.get("state") not in ("error", "failure", "pending", "success"):
                return 422, {"message": "Validation Failed"}, {}
            made = {
                "id": 9000 + sum(len(v) for v in gh.statuses.values()),
                "state": body["state"],
                "description": body.get("description"),
                "target_url": body.get("target_url"),
                "context": body.get("context", "default"),
                "created_at": gh.now(),
                "creator": gh.user(gh.bot),
            }
            gh.statuses[status.group(1)].append(made)
            return 201, made, {}
        match = re.fullmatch(r"/pulls/(\d+)(/merge|/reviews)?|/issues/(\d+)(/comments)?", rest)
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
                if body["state"] == "closed":
                    gh.closed_by[number] = gh.user(gh.bot)
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
            pr.update(
                merged=True, state="closed", merge_commit_sha="m" * 40, merged_by=gh.user(gh.bot)
            )
            gh.closed_by[number] = gh.user(gh.bot)
            return (
                200,
                {"sha": "m" * 40, "merged": True, "message": "Pull Request successfully merged"},
                {},
            )
        if route == "/issues/{n}/comments" and method == "POST":
            comment = gh.comment_on_github(number, gh.bot, body["body"])
            return 201, comment, {}
        if route == "/pulls/{n}/reviews" and method == "GET":
            return self._page(gh.reviews[number], query, PREFIX + full + f"/pulls/{number}/reviews")
        if route == "/issues/{n}" and method == "GET":
            issue = {
                "id": 2000 + number,
                "number": number,
                "state": pr["state"],
                "title": pr["title"],
                "user": pr["user"],
                "closed_by": gh.closed_by.get(number),
                "pull_request": {"url": pr["url"], "html_url": pr["html_url"]},
                "url": pr["issue_url"],
            }
            return 200, issue, {}
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
