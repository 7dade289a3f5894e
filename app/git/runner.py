"""Git, run safely: argv lists only (never a shell), user-supplied names validated before they
reach git and placed after `--end-of-options`, only the transports in `ALLOWED_PROTOCOLS`, and
credentials stripped from every error.

Git on the control host never runs repository content (docs/design.md, "Hosts and boundaries"):
every call disables hooks and fsmonitor, reads no system or global config, and gets a minimal
environment instead of the service's own (GitPython's `Git.execute` always merges in
`os.environ`, secrets included, so git is started here with `subprocess` directly).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import SecretStr

from app.errors import AutopilotError
from app.git import refstore
from app.git.exceptions import (
    BaseBranchMissing,
    FetchFailed,
    GitFailed,
    InvalidRef,
    TransportNotAllowed,
)
from app.git.upkeep import Upkeep
from app.projects import schemas as ops_schemas
from app.redaction import redact_text

log = logging.getLogger(__name__)

# `ext::` and `fd::` run commands; git refuses any transport not listed here (GIT_ALLOW_PROTOCOL).
ALLOWED_PROTOCOLS = ("file", "git", "http", "https", "ssh")
#: Set on every call: a repository's own config or files can make git run nothing.
SAFE_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "protocol.ext.allow=never",
)
#: What git may see of the service's environment (no secret is among them).
_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SSH_AUTH_SOCK")


@functools.lru_cache(maxsize=8)
def git_program(path: str | None) -> str:
    """git's full path on the PATH it is given, looked up once: a bare `git` has every call
    search PATH (a failed exec per directory before git's, and the search in Python)."""
    return shutil.which("git", path=path) or "git"


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
    if not accepts_ref(f"refs/heads/{name}"):
        raise InvalidRef(
            f"branch name {name!r} is not a valid git ref (git check-ref-format)"
        ) from None
    return name


def accepts_ref(ref: str) -> bool:
    """`git check-ref-format <ref>`'s answer (its rules 1-10, without `--allow-onelevel`,
    `--refspec-pattern` or `--normalize`), computed here: a git process for it cost ~2 ms, and
    every new cycle branch on every host asked (tests/integration/git/test_ref_format.py compares
    the two on a corpus)."""
    if ref == "@" or "/" not in ref or ref.startswith("/") or ref.endswith(("/", ".")):
        return False  # rules 2, 6, 7, 9
    if ".." in ref or "@{" in ref or "//" in ref:
        return False  # rules 3, 8, 6
    if any(ord(c) < 32 or c in " ~^:?*[\\\x7f" for c in ref):
        return False  # rules 4, 5, 10
    return not any(part.startswith(".") or part.endswith(".lock") for part in ref.split("/"))


def minimal_env() -> dict[str, str]:
    """The environment every git call starts from: no service secret, no user or system
    config (`HOME` points nowhere git could read a `.gitconfig` from)."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_ALLOW}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(
        HOME="/nonexistent",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
        LC_ALL="C",
        LANGUAGE="C",
    )
    return env


def github_git_prefix(api_base_url: str) -> str:
    """The git URL prefix of the GitHub whose API is at `api_base_url`: the only URLs its token
    is sent to (`https://api.github.com` → `https://github.com/`; a GitHub Enterprise
    `https://ghe.example/api/v3` → `https://ghe.example/`)."""
    parts = urlsplit(api_base_url)
    host = parts.netloc
    if host == "api.github.com":
        host = "github.com"
    return f"https://{host}/"


def last_line(message: str) -> str:
    """Where a git error says what went wrong: its last `fatal:` line and what follows it (git
    puts the cause, e.g. `errno=Connection refused`, on the line after), on one line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    fatal = [i for i, line in enumerate(lines) if "fatal:" in line]
    return " ".join(lines[fatal[-1] :] if fatal else lines[-1:]) or message


def _append_config(env: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """`extra` with its GIT_CONFIG_KEY_n/VALUE_n numbered after those already in `env`, so
    that an extra setting adds to the safe ones instead of replacing them."""
    count = int(extra.get("GIT_CONFIG_COUNT", "0") or 0)
    if not count:
        return dict(extra)
    numbered = {f"GIT_CONFIG_{kind}_{i}" for kind in ("KEY", "VALUE") for i in range(count)}
    out = {k: v for k, v in extra.items() if k != "GIT_CONFIG_COUNT" and k not in numbered}
    start = int(env.get("GIT_CONFIG_COUNT", "0") or 0)
    for i in range(count):
        out[f"GIT_CONFIG_KEY_{start + i}"] = extra[f"GIT_CONFIG_KEY_{i}"]
        out[f"GIT_CONFIG_VALUE_{start + i}"] = extra[f"GIT_CONFIG_VALUE_{i}"]
    out["GIT_CONFIG_COUNT"] = str(start + count)
    return out


#: A read named by a full object id (`<sha>` or `<sha>:<path>`), whose output cannot change.
_OBJECT_NAME = re.compile(r"(?:[0-9a-f]{40}|[0-9a-f]{64})(?::.*)?", re.DOTALL)
#: `cat-file` forms that print an object's content (not `-e`/`-t`: whether it exists *here*
#: can change, after a re-clone or a gc).
_CAT_FILE_CONTENT = ("blob", "tree", "commit", "-p")
#: Kept outputs, all together, and the largest kept (a recursive `ls-tree` of a large repo).
_READS_KEPT_BYTES = 32 << 20
_READ_KEPT_MAX_BYTES = 1 << 20


class _ObjectReads:
    """Outputs of git reads of objects named by full ids, per repository: an object's content
    never changes, and a cycle reads the same base config and trees several times (plan,
    prepare, the protected-path checks of commit and push), a git process each. Bounded by
    bytes, least recently used out first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, tuple[str, ...]], bytes] = OrderedDict()
        self._bytes = 0

    @staticmethod
    def cacheable(args: Sequence[str], stdin: bytes | None, extra_env: object) -> bool:
        """Only reads whose output is the object's content alone: `cat-file <type>|-p`,
        `ls-tree`, and `show <sha>:<path>` (a `show` of a commit also prints notes and
        mailmapped names, which change)."""
        if len(args) < 2 or stdin is not None or extra_env:
            return False
        name = _OBJECT_NAME.fullmatch(args[-1])
        if name is None:
            return False
        if args[0] == "cat-file":
            return len(args) == 3 and args[1] in _CAT_FILE_CONTENT
        if args[0] == "show":
            return len(args) == 2 and ":" in args[1]
        return args[0] == "ls-tree"

    def get(self, key: tuple[str, tuple[str, ...]]) -> bytes | None:
        with self._lock:
            out = self._kept.get(key)
            if out is not None:
                self._kept.move_to_end(key)
            return out

    def put(self, key: tuple[str, tuple[str, ...]], out: bytes) -> None:
        if len(out) > _READ_KEPT_MAX_BYTES:
            return
        with self._lock:
            previous = self._kept.pop(key, None)
            self._bytes -= len(previous) if previous is not None else 0
            self._kept[key] = out
            self._bytes += len(out)
            while self._bytes > _READS_KEPT_BYTES:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= len(dropped)


_object_reads = _ObjectReads()
#: When git's upkeep runs in a repository this process writes (see `Upkeep`).
upkeep = Upkeep()

#: `git push` to a repository on this host runs receive-pack under `sh` with the repository's
#: own config only (git clears GIT_CONFIG_* for a local transport): its `gc --auto` after every
#: push is turned off on its command line instead, and `Upkeep` runs it every so often.
_RECEIVE_PACK = "git -c receive.autogc=false receive-pack"


def _command(args: Sequence[str]) -> str:
    """The git command of `args` (`fetch` of `-c x=y fetch ...`)."""
    i = 0
    while i < len(args) and args[i] == "-c":
        i += 2
    return str(args[i]) if i < len(args) else ""


def local_path(url: str | None) -> Path | None:
    """The repository a push to `url` writes on this host, or None for a remote one."""
    if url is None:
        return None
    if url.startswith("/"):
        return Path(url)
    if url.startswith("file://"):
        return Path(url.removeprefix("file://"))
    return None


class GitRunner:
    """Runs git with a fixed, safe environment and turns failures into redacted `GitFailed`."""

    def __init__(
        self,
        *,
        token: SecretStr | None = None,
        token_prefix: str = "https://github.com/",  # noqa: S107 - a URL prefix, not a secret
        timeout_s: float = 600.0,
        author: tuple[str, str],
    ) -> None:
        self._token = token
        self._token_prefix = token_prefix
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
        env = minimal_env()
        env |= {
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
        settings = list(SAFE_CONFIG)
        token = self._token.get_secret_value() if self._token is not None else ""
        if token and url is not None and url.startswith(self._token_prefix):
            # The token travels as a header in the environment: not in argv, not in a URL,
            # not in any config file; git never prints extra headers. It is scoped to the
            # GitHub host's URLs, so a redirect or a second remote elsewhere never gets it.
            settings.append(
                f"http.{self._token_prefix}.extraHeader=Authorization: Basic {self._basic(token)}"
            )
            # After a redirect git sends its extra headers to the new host on every later
            # request (curl drops them only on the redirect hop itself).
            settings.append(f"http.{self._token_prefix}.followRedirects=false")
        env["GIT_CONFIG_COUNT"] = str(len(settings))
        for i, setting in enumerate(settings):
            key, _, value = setting.partition("=")
            env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
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
        return (
            self.run_bytes(args, cwd, url=url, identity=identity, extra_env=extra_env)
            .decode(errors="replace")
            .rstrip("\n")
        )

    def run_bytes(
        self,
        args: Sequence[str],
        cwd: Path,
        *,
        url: str | None = None,
        identity: bool = False,
        extra_env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> bytes:
        """Run git; its stdout as bytes (a blob may not be text). A read of an object named by
        its full id is answered from what an earlier read of it in the same repository got."""
        key = (str(Path(cwd).absolute()), tuple(args))
        cacheable = _ObjectReads.cacheable(args, stdin, extra_env)
        if cacheable and (kept := _object_reads.get(key)) is not None:
            return kept
        env = self.env(url=url, identity=identity)
        if extra_env:
            env.update(_append_config(env, extra_env))
        command = self.redact(str(args[0]) if args else "")
        # Git's own upkeep after each fetch and push (`maintenance run --auto`, receive-pack's
        # `gc --auto`) is left to `upkeep`, which runs it once per so many writes.
        written: Path | None = None
        if _command(args) == "fetch":
            args, written = ["-c", "maintenance.auto=false", *args], Path(cwd)
        elif args and args[0] == "push" and (written := local_path(url)) is not None:
            args = ["push", f"--receive-pack={_RECEIVE_PACK}", *args[1:]]
        try:
            done = subprocess.run(  # noqa: S603 - argv list, names checked before they get here
                [git_program(env.get("PATH")), *args],
                cwd=cwd,
                env=env,
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                timeout=self._timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise GitFailed(
                f"git {command} ran past {self._timeout_s:g} s and was killed"
            ) from None
        except OSError as exc:
            raise GitFailed(f"git {command} cannot start: {exc}") from None
        if done.returncode != 0:
            message = self.redact(done.stderr.decode(errors="replace").strip())
            raise GitFailed(
                f"git {command} failed (exit {done.returncode}): {message or 'no message'}",
                exit_status=done.returncode,
            )
        if cacheable:
            _object_reads.put(key, done.stdout)
        if written is not None and upkeep.due(written):
            self.maintain(written)
        return done.stdout

    def maintain(self, repo: Path) -> None:
        """`git maintenance run --auto` in `repo`: what git runs after a fetch on its own (a
        `gc --auto`: it packs loose objects only past `gc.auto`, 6,700 of them)."""
        try:
            self.run_bytes(["maintenance", "run", "--auto", "--quiet"], repo)
        except GitFailed as exc:  # a repository left as it was; the next write tries again
            log.warning("git maintenance in %s failed: %s", repo, exc.detail)

    def ref_tips(self, cwd: Path, *refs: str) -> dict[str, str]:
        """The commits full refs (`refs/heads/x`) point at, by ref; a ref that does not exist
        is left out. One git for all of them, where a `rev-parse --verify` a ref took one
        each (a step checks that its branch exists and reads its tip, and the base's). Read
        from the repository's files where they answer for certain (`refstore`), else by git."""
        if (read := refstore.tips(cwd, refs)) is not None:
            return read
        listed = self.run(
            ["for-each-ref", "--format=%(objectname) %(objecttype) %(refname)", *refs], cwd
        )
        tips: dict[str, str] = {}
        for line in listed.splitlines():
            sha, kind, name = line.split(" ", 2)
            if name not in refs:  # a pattern also lists the refs below it: `x/...`
                continue
            if kind != "commit":  # an annotated tag under a branch's name: its commit
                sha = self.run(["rev-parse", "--verify", f"{name}^{{commit}}"], cwd)
            tips[name] = sha
        refstore.remember(*tips.values())
        return tips

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


@contextlib.contextmanager
def single_flight(path: Path, key: str) -> Iterator[bool]:
    """Under `repo_lock(path)`: yields whether this caller must do the work named `key` (a
    fetch of one URL), recording it when the caller's block ends without an error.

    It yields False when a run of the same work *began after this caller asked* and has
    finished: that run saw the remote at least as new as this caller would, so doing it again
    only queues behind the lock (many cycles of one project fetching its mirror at once share
    one fetch). The record is the wall-clock start of the last finished run and a hash of its
    key, in `<path>.flight` next to the lock."""
    asked = time.time()
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    record = path.with_name(path.name + ".flight")
    with repo_lock(path):
        with contextlib.suppress(OSError, ValueError):
            began, done = record.read_text().split()
            if done == digest and float(began) >= asked:
                yield False
                return
        began_now = time.time()
        yield True
        record.write_text(f"{began_now!r} {digest}\n")


def fetch_failure(exc: GitFailed, url: str, branch: str | None = None) -> AutopilotError:
    """What a failed fetch of `url` means: the branch is not there (when one was asked for),
    else a fetch that may pass (FetchFailed, retried), with git's own words."""
    if branch is not None and "couldn't find remote ref" in exc.detail.lower():
        return BaseBranchMissing(f"branch {branch!r} is not on {redact_text(url)[:200]}")
    return FetchFailed(f"cannot fetch {redact_text(url)[:200]}: {last_line(exc.detail)}")
