"""The local forge over git's smart HTTP, read-only: GPU hosts fetch branches from the API.

`git http-backend` (a CGI program) speaks the protocol. This module admits only the fetch side
(`info/refs?service=git-upload-pack` and `git-upload-pack`), refuses pushes with 403, checks a
token with scope `worker` (a bearer token, or the token as an HTTP Basic password, which is what
credential helpers send), and runs the CGI with an environment built from scratch: no service
secret reaches git, and no system or global git config (hooks, fsmonitor) is read.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import re
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from app.api.deps import SettingsDep, StoresDep
from app.errors import NotFound, Unauthorized
from app.forge.base import ProjectRef
from app.forge.exceptions import (
    ForgeBackendFailed,
    ForgeCredentialsNeeded,
    ForgeReadOnly,
    ForgeRepositoryNotFound,
)
from app.forge.local import HTTP_PREFIX, LocalForge
from app.git.runner import git_program
from app.projects import service as ops
from app.projects.schemas import check_slug
from app.redaction import redact_text

log = logging.getLogger(__name__)

FETCH = "git-upload-pack"
PUSH = "git-receive-pack"
SCOPE = "worker"
# The CGI runs with these only (plus its own variables): git is found, nothing else inherited.
CGI_PATH = "/usr/local/bin:/usr/bin:/bin"
GIT_SAFETY = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "http.receivepack=false",
    "-c",
    "http.getanyfile=false",
)
# The Git-Protocol header (`version=2`) is handed to the CGI; only its plain form.
_GIT_PROTOCOL = re.compile(r"^[A-Za-z0-9=:._-]{1,64}$")
MAX_CGI_HEAD = 64 * 1024
CHUNK = 64 * 1024

router = APIRouter(prefix=HTTP_PREFIX, include_in_schema=False)


@dataclass(frozen=True)
class Target:
    """One admitted fetch request: which repository, and what the CGI is asked."""

    root: Path
    path_info: str
    query: str


def service_of(method: str, rest: str, service: str | None) -> str:
    """The smart-HTTP step a request asks for: 'info/refs' or 'git-upload-pack'.

    Pushes are refused (403) whatever the token; anything else, the dumb protocol included, is
    not served (404)."""
    if (rest == "info/refs" and service == PUSH) or rest == PUSH:
        raise ForgeReadOnly(
            "the forge is read-only over HTTP; cycles push on the control host, not over the API"
        )
    if method == "GET" and rest == "info/refs" and service == FETCH:
        return rest
    if method == "POST" and rest == FETCH:
        return rest
    raise NotFound(
        "only git's smart-HTTP fetch is served here: "
        "GET info/refs?service=git-upload-pack and POST git-upload-pack"
    )


def presented_token(authorization: str | None) -> str | None:
    """The token in `Bearer <token>` or in HTTP Basic's password (any user name)."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    value = value.strip()
    if not value:
        return None
    if scheme.lower() == "bearer":
        return value
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        _, sep, password = decoded.partition(":")
        return password if sep and password else None
    return None


def _target(
    request: Request, project: str, rest: str, settings: SettingsDep, stores: StoresDep
) -> Target:
    try:
        check_slug(project, "project")
    except ValueError as exc:
        raise ForgeRepositoryNotFound(str(exc)) from None
    step = service_of(request.method, rest, request.query_params.get("service"))
    # Its own short session, as for the REST API: nothing is held open while git runs.
    with stores.ops_session() as session:
        try:
            token = ops.authenticate(session, presented_token(request.headers.get("authorization")))
        except Unauthorized as exc:
            raise ForgeCredentialsNeeded(
                f"{exc.detail}. git sends a token with "
                "`git -c http.extraHeader='Authorization: Bearer <token>'` or as the password "
                "from a credential helper; it needs scope worker"
            ) from None
        ops.require_scope(token, SCOPE)
        ref = ProjectRef.of(ops.get_project(session, project))
    request.state.token_name = token.name
    forge = LocalForge(settings, stores)
    if not (forge.bare_path(ref) / "HEAD").is_file():
        raise ForgeRepositoryNotFound(
            f"project {project!r} has no repository on the local forge yet; a cycle makes it, "
            "or its forge is GitHub (fetch from there)"
        )
    query = f"service={FETCH}" if step == "info/refs" else ""
    return Target(root=forge.root, path_info=f"/{project}.git/{step}", query=query)


async def _body(request: Request) -> bytes:
    # The whole request is read first: an upload-pack request is a negotiation (wants and
    # haves), capped by the BodySizeLimit middleware and by git's own 10 MB request buffer.
    return await request.body()


def cgi_environment(
    target: Target, method: str, content_type: str, length: int, headers: dict[str, str]
) -> dict[str, str]:
    """The CGI's whole environment, built from nothing: no variable of the service leaks in."""
    env = {
        "PATH": CGI_PATH,
        "HOME": str(target.root),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PROJECT_ROOT": str(target.root),
        "GIT_HTTP_EXPORT_ALL": "1",
        "PATH_INFO": target.path_info,
        "QUERY_STRING": target.query,
        "REQUEST_METHOD": method,
    }
    if method == "POST":
        env["CONTENT_TYPE"] = content_type
        env["CONTENT_LENGTH"] = str(length)
        # git clients gzip large negotiations; http-backend inflates them itself.
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip"):
            env["HTTP_CONTENT_ENCODING"] = encoding
    protocol = headers.get("git-protocol", "")
    if _GIT_PROTOCOL.fullmatch(protocol):
        env["HTTP_GIT_PROTOCOL"] = protocol
    return env


def parse_cgi_head(stream: IO[bytes]) -> tuple[int, list[tuple[str, str]]]:
    """Read a CGI response's header block: its status (the `Status:` line, else 200) and the
    other headers, leaving the body in the stream."""
    status, size = 200, 0
    headers: list[tuple[str, str]] = []
    while True:
        line = stream.readline(MAX_CGI_HEAD)
        size += len(line)
        if not line or size > MAX_CGI_HEAD:
            raise ForgeBackendFailed("git http-backend ended before the end of its headers")
        line = line.rstrip(b"\r\n")
        if not line:
            return status, headers
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name.strip():
            raise ForgeBackendFailed(f"git http-backend wrote a malformed header {line[:80]!r}")
        if name.strip().lower() == "status":
            try:
                status = int(value.split()[0])
            except (IndexError, ValueError):
                raise ForgeBackendFailed(f"git http-backend wrote status {value!r}") from None
        else:
            headers.append((name.strip(), value.strip()))


class BackendRun:
    """One `git http-backend` process: the request body fed on stdin by a thread (so a large
    request and a large response cannot block each other), the response read from stdout."""

    def __init__(self, target: Target, env: dict[str, str], body: bytes) -> None:
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed in finish()
        self.process = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            [git_program(CGI_PATH), *GIT_SAFETY, "http-backend"],
            cwd=target.root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
        )
        self._feeder = threading.Thread(target=self._feed, args=(body,), daemon=True)
        self._feeder.start()
        self._done = False
        self.error = ""  # the last line git wrote to stderr, once finished

    def _feed(self, body: bytes) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(body)
        except (BrokenPipeError, ValueError):
            pass  # the backend answered (an error) without reading it all
        finally:
            with contextlib.suppress(BrokenPipeError):
                stdin.close()

    @property
    def stdout(self) -> IO[bytes]:
        assert self.process.stdout is not None
        return self.process.stdout

    def chunks(self) -> Iterator[bytes]:
        try:
            while chunk := self.stdout.read1(CHUNK):  # type: ignore[attr-defined]
                yield chunk
        finally:
            self.finish()

    def _stderr_tail(self) -> str:
        self._errors.seek(0)
        text = self._errors.read()[-2000:].decode("utf-8", "replace").strip()
        return redact_text(text.splitlines()[-1] if text else "no message")

    def finish(self) -> None:
        """Idempotent: close the pipe (a client that went away stops git), reap the process."""
        if self._done:
            return
        self._done = True
        self.stdout.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._feeder.join(timeout=30)
        self.error = self._stderr_tail()
        if self.process.returncode != 0:
            log.warning("git http-backend exited %s: %s", self.process.returncode, self.error)
        self._errors.close()


@router.api_route(
    "/{project}.git/{rest:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
)
def serve(
    request: Request,
    target: Annotated[Target, Depends(_target)],
    body: Annotated[bytes, Depends(_body)],
) -> StreamingResponse:
    """A fetch from a local-forge repository, answered by `git http-backend` and streamed."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    env = cgi_environment(
        target, request.method, headers.get("content-type", ""), len(body), headers
    )
    run = BackendRun(target, env, body)
    try:
        status, cgi_headers = parse_cgi_head(run.stdout)
    except ForgeBackendFailed as exc:
        run.finish()
        raise ForgeBackendFailed(f"{exc.detail}: {run.error}") from None
    except BaseException:
        run.finish()
        raise
    return StreamingResponse(
        run.chunks(),
        status_code=status,
        headers=dict(cgi_headers),
        background=BackgroundTask(run.finish),
    )
