"""GitHub (and GitHub Enterprise) as the forge, through PyGithub.

Rate limits (primary and secondary, 403/429 with `Retry-After`) are PyGithub's `GithubRetry`'s
job; 5xx and dropped connections get our own backoff, and every retried write looks up first,
so a retry after a lost answer never creates a second PR or comment. Writes go one at a time,
as GitHub asks of integrations. The token lives in a `SecretStr` and in PyGithub's auth object;
PyGithub masks it in its debug log, and our errors are redacted again before they leave.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import requests
from github import Auth, Github, GithubException, GithubRetry
from github.PullRequest import PullRequest as GhPullRequest
from github.Repository import Repository
from pydantic import SecretStr

from app.errors import InvalidInput
from app.forge.base import CommitState, ForgeDecision, ProjectRef, PullRequest, PullRequestState
from app.forge.exceptions import (
    ForgeRejected,
    ForgeUnavailable,
    HeadMoved,
    PullRequestNotFound,
    PullRequestNotOpen,
)
from app.git.exceptions import MergeConflict
from app.git.runner import check_branch_name, check_url
from app.redaction import redact_text
from app.settings import Settings

T = TypeVar("T")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_ALREADY_EXISTS = "a pull request already exists"
_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
# GitHub asks integrations to make content-creating requests serially.
_WRITE_LOCK = threading.Lock()


def github_repo(url: str) -> str:
    """`owner/name` of a GitHub repository URL (https, ssh or scp-like `git@host:owner/name`)."""
    check_url(url)
    if "://" in url:
        path = urlsplit(url).path
    elif url.startswith("/"):
        path = url
    else:
        path = url.split(":", 1)[1]
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2:
        owner, name = parts[-2], parts[-1].removesuffix(".git")
        if _NAME.fullmatch(owner) and _NAME.fullmatch(name):
            return f"{owner}/{name}"
    raise InvalidInput(f"cannot read owner/name from repository URL {redact_text(url)!r}")


# Loggers that may see request or response text: PyGithub's debug log prints response bodies,
# and a server that echoes a credential back would otherwise put it in our logs.
_HTTP_LOGGERS = ("github", "github.Requester", "github.GithubRetry", "urllib3.connectionpool")


class _RedactSecrets(logging.Filter):
    def __init__(self, secret: SecretStr) -> None:
        super().__init__()
        self._secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        value = self._secret.get_secret_value()
        message = record.getMessage()
        if value and value in message:
            record.msg, record.args = message.replace(value, "***"), None
        return True


def _guard_logs(secret: SecretStr) -> None:
    for name in _HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactSecrets) and f._secret == secret for f in logger.filters):
            logger.addFilter(_RedactSecrets(secret))


class GitHubForge:
    def __init__(
        self,
        *,
        auth: Auth.Auth,
        base_url: str = "https://api.github.com",
        secret: SecretStr | None = None,
        attempts: int = 4,
        backoff_s: float = 1.0,
        secondary_rate_wait_s: float = 60.0,
        max_rate_limit_wait_s: float | None = 900.0,
        seconds_between_requests: float | None = 0.25,
        seconds_between_writes: float | None = 1.0,
        per_page: int = 100,
        timeout_s: int = 30,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        retry = GithubRetry(
            total=attempts + 6,
            backoff_factor=backoff_s,
            secondary_rate_wait=secondary_rate_wait_s,
            max_rate_limit_wait=max_rate_limit_wait_s,
            # 403 is added by GithubRetry and retried only when it is a rate limit; 5xx is ours.
            status_forcelist=[429],
        )
        self._github = Github(
            auth=auth,
            base_url=base_url.rstrip("/"),
            retry=retry,
            per_page=per_page,
            timeout=timeout_s,
            seconds_between_requests=seconds_between_requests,
            seconds_between_writes=seconds_between_writes,
        )
        self._secret = secret
        if secret is not None:
            _guard_logs(secret)
        self._attempts = max(1, attempts)
        self._backoff_s = backoff_s
        self._sleep = sleep
        self._repos: dict[str, Repository] = {}

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> GitHubForge:
        """Token auth from `AUTOPILOT_GITHUB_TOKEN`, or GitHub App credentials when configured."""
        app_id = settings.github_app_id
        key = settings.github_app_private_key
        installation = settings.github_app_installation_id
        throttle: dict[str, Any] = {
            "seconds_between_requests": settings.github_seconds_between_requests,
            "seconds_between_writes": settings.github_seconds_between_writes,
        }
        if app_id and key and installation:
            key_text = key.get_secret_value() if isinstance(key, SecretStr) else str(key)
            auth: Auth.Auth = Auth.AppAuth(app_id, key_text).get_installation_auth(
                int(installation)
            )
            return cls(auth=auth, base_url=settings.github_base_url, **{**throttle, **options})
        token = settings.github_token
        if token is None or not token.get_secret_value():
            raise InvalidInput(
                "the GitHub forge needs AUTOPILOT_GITHUB_TOKEN (or GitHub App credentials)"
            )
        return cls(
            auth=Auth.Token(token.get_secret_value()),
            base_url=settings.github_base_url,
            secret=token,
            **{**throttle, **options},
        )

    # -- plumbing ---------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        text = redact_text(text)
        if self._secret is not None and (value := self._secret.get_secret_value()):
            text = text.replace(value, "***")
        return text

    def _message(self, exc: GithubException) -> str:
        data = exc.data if isinstance(exc.data, dict) else {}
        parts = [str(data.get("message") or exc.message or "")]
        for error in data.get("errors") or []:
            if isinstance(error, dict) and error.get("message"):
                parts.append(str(error["message"]))
            elif isinstance(error, str):
                parts.append(error)
        return self._redact("; ".join(p for p in parts if p) or f"HTTP {exc.status}")

    def _translate(self, exc: GithubException, what: str) -> Exception:
        message = self._message(exc)
        if exc.status >= 500 or exc.status in (403, 429) and "rate limit" in message.lower():
            return ForgeUnavailable(f"GitHub could not {what} ({exc.status}): {message}; try later")
        if exc.status == 404:
            return PullRequestNotFound(f"GitHub: {what}: not found ({message})")
        return ForgeRejected(
            f"GitHub refused to {what} ({exc.status}): {message}", status_code=exc.status
        )

    def _call(self, what: str, fn: Callable[[bool], T]) -> T:
        """Run `fn(first_attempt)`, backing off on 5xx and dropped connections."""
        delay = self._backoff_s
        for attempt in range(1, self._attempts + 1):
            try:
                return fn(attempt == 1)
            except GithubException as exc:
                if exc.status < 500 or attempt == self._attempts:
                    raise self._translate(exc, what) from None
            except requests.RequestException as exc:
                if attempt == self._attempts:
                    raise ForgeUnavailable(
                        f"GitHub could not {what}: {self._redact(type(exc).__name__)}; try later"
                    ) from None
            self._sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _repo(self, project: ProjectRef) -> Repository:
        name = github_repo(project.repo_url)
        if name not in self._repos:
            self._repos[name] = self._call(f"read {name}", lambda _: self._github.get_repo(name))
        return self._repos[name]

    @staticmethod
    def _convert(project: ProjectRef, pr: GhPullRequest) -> PullRequest:
        state: PullRequestState = (
            "merged" if pr.merged else ("open" if pr.state == "open" else "closed")
        )
        return PullRequest(
            project=project.name,
            number=pr.number,
            url=pr.html_url,
            head=pr.head.ref,
            base=pr.base.ref,
            title=pr.title or "",
            body=pr.body or "",
            state=state,
            head_sha=pr.head.sha,
            merge_sha=pr.merge_commit_sha if pr.merged else None,
        )

    def _find_open(self, repo: Repository, head: str, base: str) -> GhPullRequest | None:
        """The open PR from `head` (into `base` if several bases have one), across all pages."""
        owner = repo.owner.login
        first = None
        for pr in repo.get_pulls(state="open", head=f"{owner}:{head}"):
            if pr.head.ref != head:
                continue
            if pr.base.ref == base:
                return pr
            first = first or pr
        return first

    # -- the forge interface ------------------------------------------------------------------

    def remote_url(self, project: ProjectRef) -> str:
        return check_url(project.repo_url)

    def fetch_url(self, project: ProjectRef) -> str:
        return check_url(project.repo_url)

    def sync_base(self, project: ProjectRef) -> None:
        return None  # the project's repository is the forge: nothing to copy

    def place_branch(self, project: ProjectRef, branch: str, sha: str) -> bool:
        return False  # a push it is: the branch's commits travel with it

    def take_branch(self, project: ProjectRef, mirror: Path, branch: str, sha: str) -> bool:
        return False  # another host: a push it is

    def file_url(self, project: ProjectRef, sha: str, path: str) -> str:
        """`<repository page>/blob/<sha>/<path>`: the file as committed, whatever moves later.
        The repository page is the API's `html_url` (GitHub Enterprise included), so no token
        or API host ends up in a link people follow."""
        if not _SHA.fullmatch(sha):
            raise InvalidInput(f"expected a full commit sha (40 hex digits), got {sha[:80]!r}")
        parts = path.split("/")
        if not path or any(p in ("", ".", "..") for p in parts):
            raise InvalidInput(f"expected a relative file path inside the repository: {path!r}")
        page = self._repo(project).html_url
        return f"{page.rstrip('/')}/blob/{sha}/{quote(path)}"

    def open_pull_request(
        self, project: ProjectRef, head: str, base: str, title: str, body: str
    ) -> PullRequest:
        check_branch_name(head)
        check_branch_name(base)
        repo = self._repo(project)

        def find_or_create(_first: bool) -> GhPullRequest:
            existing = self._find_open(repo, head, base)
            if existing is not None:
                return existing
            try:
                return repo.create_pull(base=base, head=head, title=title, body=body)
            except GithubException as exc:
                if exc.status == 422 and _ALREADY_EXISTS in self._message(exc).lower():
                    found = self._find_open(repo, head, base)
                    if found is not None:
                        return found
                raise

        with _WRITE_LOCK:
            pr = self._call(f"open a pull request for {head}", find_or_create)
        return self._convert(project, pr)

    def _pull(self, project: ProjectRef, number: int) -> GhPullRequest:
        repo = self._repo(project)
        return self._call(f"read pull request #{number}", lambda _: repo.get_pull(number))

    def get_pull_request(self, project: ProjectRef, number: int) -> PullRequest:
        return self._convert(project, self._pull(project, number))

    def comment(self, project: ProjectRef, number: int, body: str) -> None:
        pr = self._pull(project, number)
        # A marker unique to this call lets a retry see whether a lost attempt landed.
        marker = f"<!-- autopilot:{uuid.uuid4().hex} -->"

        def post(first: bool) -> None:
            if not first and any(marker in (c.body or "") for c in pr.get_issue_comments()):
                return
            pr.create_issue_comment(f"{body}\n\n{marker}")

        with _WRITE_LOCK:
            self._call(f"comment on #{number}", post)

    def merge(
        self,
        project: ProjectRef,
        number: int,
        *,
        message: str | None = None,
        expected_head_sha: str | None = None,
    ) -> PullRequest:
        pr = self._pull(project, number)
        if pr.merged:
            return self._convert(project, pr)
        if pr.state != "open":
            raise PullRequestNotOpen(f"pull request #{number} is {pr.state}; reopen it first")
        if expected_head_sha and pr.head.sha != expected_head_sha:
            raise HeadMoved(
                f"#{number}'s head is {pr.head.sha}, not the reviewed {expected_head_sha}"
            )

        def put(first: bool) -> None:
            if not first:
                fresh = self._pull(project, number)
                if fresh.merged:
                    return
            try:
                pr.merge(
                    commit_message=message or "",
                    merge_method="merge",
                    sha=expected_head_sha or pr.head.sha,
                )
            except GithubException as exc:
                if exc.status == 405:
                    raise MergeConflict(
                        f"GitHub will not merge #{number}: {self._message(exc)}"
                    ) from None
                if exc.status == 409:
                    raise HeadMoved(f"#{number}'s head moved: {self._message(exc)}") from None
                raise

        with _WRITE_LOCK:
            self._call(f"merge #{number}", put)
        return self.get_pull_request(project, number)

    def close(self, project: ProjectRef, number: int) -> PullRequest:
        pr = self._pull(project, number)
        if pr.state == "open":
            with _WRITE_LOCK:
                self._call(f"close #{number}", lambda _: pr.edit(state="closed"))
        return self.get_pull_request(project, number)

    # -- what people decided on GitHub ---------------------------------------------------------

    def decision(self, project: ProjectRef, number: int) -> ForgeDecision:
        """PR `number`'s state, who merged or closed it and the last note a person left on it
        (a review's or a comment's text): what a reconciliation or a webhook records."""
        pr = self._pull(project, number)
        state = self._convert(project, pr).state
        if state == "open":
            return ForgeDecision(state, None, "")
        actor: str | None
        if state == "merged":
            actor = pr.merged_by.login if pr.merged_by is not None else None
        else:
            repo = self._repo(project)
            issue = self._call(f"read issue #{number}", lambda _: repo.get_issue(number))
            actor = issue.closed_by.login if issue.closed_by is not None else None
        return ForgeDecision(state, actor, self.last_note(project, number))

    def last_note(self, project: ProjectRef, number: int) -> str:
        """The text of the latest review or comment a person left on PR `number` ('' if none):
        our own comments (they carry a marker) and `/autopilot` commands are not notes."""
        pr = self._pull(project, number)

        def notes(_first: bool) -> list[tuple[Any, str]]:
            found = [(r.submitted_at, r.body or "") for r in pr.get_reviews()]
            found += [(c.created_at, c.body or "") for c in pr.get_issue_comments()]
            return found

        kept = [
            (when, body.strip())
            for when, body in self._call(f"read the reviews of #{number}", notes)
            if body.strip()
            and "<!-- autopilot:" not in body
            and not body.lstrip().startswith("/autopilot")
            and when is not None
        ]
        return max(kept, key=lambda item: item[0])[1] if kept else ""

    def can_write(self, project: ProjectRef, login: str) -> bool:
        """Whether GitHub user `login` may write to the project's repository (admin, maintain
        and write roles all read as `write` or `admin` here)."""
        repo = self._repo(project)
        try:
            permission = self._call(
                f"read the permission of {login}",
                lambda _: repo.get_collaborator_permission(login),
            )
        except PullRequestNotFound:  # a 404: no such user, or no collaborator
            return False
        return permission in ("admin", "write")

    def set_commit_status(
        self,
        project: ProjectRef,
        sha: str,
        state: CommitState,
        description: str,
        target_url: str,
        context: str,
    ) -> None:
        """A commit status on `sha` (GitHub shows it on the PR's checks); posting it again
        replaces the one of the same context, so a retry is harmless."""
        if not _SHA.fullmatch(sha):
            raise InvalidInput(f"expected a full commit sha, got {sha[:80]!r}")
        repo = self._repo(project)
        commit = self._call(f"read commit {sha[:12]}", lambda _: repo.get_commit(sha))
        with _WRITE_LOCK:
            self._call(
                f"set the status of {sha[:12]}",
                lambda _: commit.create_status(
                    state, target_url=target_url, description=description[:140], context=context
                ),
            )
