"""Git, run safely: argv lists only (never a shell), user-supplied names validated before they
reach git and placed after `--end-of-options`, only the transports in `ALLOWED_PROTOCOLS`, and
credentials stripped from every error."""

from __future__ import annotations

import base64
import contextlib
import fcntl
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from git import Git, GitCommandError
from pydantic import SecretStr

from app.errors import AutopilotError
from app.forge.exceptions import (
    BaseBranchMissing,
    FetchFailed,
    GitFailed,
    InvalidRef,
    TransportNotAllowed,
)
from app.projects import schemas as ops_schemas
from app.settings import redact_text

# `ext::` and `fd::` run commands; git refuses any transport not listed here (GIT_ALLOW_PROTOCOL).
ALLOWED_PROTOCOLS = ("file", "git", "http", "https", "ssh")


def check_url(url: str) -> str:
    """A repository URL git may use: an absolute path or an allowed transport, never `ext::`."""
    try:
        return ops_schemas.check_repo_url(url)
    except ValueError as exc:
        raise TransportNotAllowed(
            f"{exc}; got {redact_text(url)[:200]!r}", url=redact_text(url)[:200]
        ) from None


def check_branch_name(name: str) -> str:
    """A branch name git accepts as-is and cannot read as an option or a range."""
    if not name or name.startswith("-") or ".." in name or "@{" in name:
        raise InvalidRef(f"branch name {name!r} is not allowed (empty, leading '-', '..' or '@{{')")
    if any(ord(c) < 32 or c in " ~^:?*[\\\x7f" for c in name):
        raise InvalidRef(f"branch name {name!r} contains a character git refs cannot hold")
    try:
        # A full ref never starts with '-', so git cannot mistake it for an option.
        Git().execute(["git", "check-ref-format", f"refs/heads/{name}"])
    except GitCommandError:
        raise InvalidRef(
            f"branch name {name!r} is not a valid git ref (git check-ref-format)"
        ) from None
    return name


def last_line(message: str) -> str:
    """Where a git error says what went wrong: its last `fatal:` line and what follows it (git
    puts the cause, e.g. `errno=Connection refused`, on the line after), on one line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    fatal = [i for i, line in enumerate(lines) if "fatal:" in line]
    return " ".join(lines[fatal[-1] :] if fatal else lines[-1:]) or message


class GitRunner:
    """Runs git with a fixed, safe environment and turns failures into redacted `GitFailed`."""

    def __init__(
        self, *, token: SecretStr | None = None, timeout_s: float = 600.0, author: tuple[str, str]
    ) -> None:
        self._token = token
        self._timeout_s = timeout_s
        self.author = author

    def redact(self, text: str) -> str:
        text = redact_text(text)
        if self._token is not None and (secret := self._token.get_secret_value()):
            text = text.replace(secret, "***")
            text = text.replace(self._basic(secret), "***")
        return text

    @staticmethod
    def _basic(secret: str) -> str:
        return base64.b64encode(f"x-access-token:{secret}".encode()).decode()

    def env(self, *, url: str | None = None, identity: bool = False) -> dict[str, str]:
        env = {
            "GIT_ALLOW_PROTOCOL": ":".join(ALLOWED_PROTOCOLS),
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ASKPASS": "",
            "SSH_ASKPASS": "",
            "GIT_SSH_COMMAND": "ssh -o BatchMode=yes",
        }
        if identity:
            name, email = self.author
            env.update(
                GIT_AUTHOR_NAME=name,
                GIT_AUTHOR_EMAIL=email,
                GIT_COMMITTER_NAME=name,
                GIT_COMMITTER_EMAIL=email,
            )
        token = self._token.get_secret_value() if self._token is not None else ""
        if token and url is not None and url.startswith("https://"):
            # The token travels as a header in the environment: not in argv, not in a URL,
            # not in any config file; git never prints extra headers.
            env.update(
                GIT_CONFIG_COUNT="1",
                GIT_CONFIG_KEY_0="http.extraHeader",
                GIT_CONFIG_VALUE_0=f"Authorization: Basic {self._basic(token)}",
            )
        return env

    def run(
        self,
        args: Sequence[str],
        cwd: Path,
        *,
        url: str | None = None,
        identity: bool = False,
        extra_env: Mapping[str, str] | None = None,
    ) -> str:
        env = self.env(url=url, identity=identity)
        if extra_env:
            env.update(extra_env)
        try:
            out = Git(str(cwd)).execute(["git", *args], env=env, kill_after_timeout=self._timeout_s)
        except GitCommandError as exc:
            stderr = exc.stderr if isinstance(exc.stderr, str) else str(exc.stderr)
            message = self.redact(stderr.strip().removeprefix("stderr: ").strip("'\n "))
            command = self.redact(str(args[0]) if args else "")
            raise GitFailed(
                f"git {command} failed (exit {exc.status}): {message or 'no message'}",
                exit_status=exc.status if isinstance(exc.status, int) else None,
            ) from None
        return out if isinstance(out, str) else out.decode()

    def ok(self, args: Sequence[str], cwd: Path) -> bool:
        try:
            self.run(args, cwd)
        except GitFailed:
            return False
        return True


@contextlib.contextmanager
def repo_lock(path: Path) -> Iterator[None]:
    """One git writer per repository at a time, across processes (fetches and ref updates)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_failure(exc: GitFailed, url: str, branch: str | None = None) -> AutopilotError:
    """What a failed fetch of `url` means: the branch is not there (when one was asked for),
    else a fetch that may pass (FetchFailed, retried), with git's own words."""
    if branch is not None and "couldn't find remote ref" in exc.detail.lower():
        return BaseBranchMissing(f"branch {branch!r} is not on {redact_text(url)[:200]}")
    return FetchFailed(f"cannot fetch {redact_text(url)[:200]}: {last_line(exc.detail)}")
