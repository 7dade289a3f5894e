"""The GitHub token reaches only the configured GitHub host: a remote elsewhere, or a redirect
from the token's host to another one, never sees it (docs/design.md, "Hosts and boundaries")."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pydantic import SecretStr

from app.errors import AutopilotError
from app.git.runner import GitRunner
from app.git.work import GitWork
from app.settings import Settings
from workers.prepare import control_auth

AUTHOR = ("t", "t@example.invalid")


@dataclass
class Recorder:
    """What a tiny HTTP server saw: each request's path and headers."""

    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def authorizations(self) -> list[str]:
        return [h["authorization"] for _, _, h in self.seen if "authorization" in h]


def _handler(
    recorder: Recorder, *, redirect_to: str | None = None, backend: Path | None = None
) -> type[BaseHTTPRequestHandler]:
    """Records every request; then redirects it (`redirect_to`), serves it with
    `git http-backend` from `backend`, or answers 404."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            recorder.seen.append((self.command, self.path, headers))
            length = int(headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            if redirect_to is not None:
                self.send_response(302)
                self.send_header("Location", redirect_to + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if backend is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "GIT_PROJECT_ROOT": str(backend),
                "GIT_HTTP_EXPORT_ALL": "1",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "CONTENT_TYPE": headers.get("content-type", ""),
                "CONTENT_LENGTH": str(len(body)),
                "GIT_PROTOCOL": headers.get("git-protocol", ""),
                "REMOTE_ADDR": "127.0.0.1",
            }
            out = subprocess.run(  # noqa: S603
                ["git", "http-backend"],  # noqa: S607
                input=body,
                env=env,
                capture_output=True,
                check=False,
            ).stdout
            head, _, payload = out.partition(b"\r\n\r\n")
            status = 200
            extra: list[tuple[str, str]] = []
            for line in head.decode().split("\r\n"):
                name, _, value = line.partition(":")
                if name.lower() == "status":
                    status = int(value.split()[0])
                elif name:
                    extra.append((name, value.strip()))
            self.send_response(status)
            for name, value in extra:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _serve  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def http_server(host: str = "127.0.0.1", **kwargs: object) -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder()
    server = ThreadingHTTPServer((host, 0), _handler(recorder, **kwargs))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/", recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def basic(canary: str) -> str:
    return base64.b64encode(f"x-access-token:{canary}".encode()).decode()


def carries(recorder: Recorder, canary: str) -> bool:
    return any(canary in a or basic(canary) in a for a in recorder.authorizations())


@pytest.fixture
def served_repo(tmp_path: Path) -> Path:
    """A bare repository `x.git` (one commit on main) under the returned root."""
    work = tmp_path / "work"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True, env=env)  # noqa: S607
    (work / "f").write_text("x\n")
    subprocess.run(["git", "-C", str(work), "add", "f"], check=True, env=env)  # noqa: S607
    subprocess.run(  # noqa: S603
        ["git", *ident, "-C", str(work), "commit", "-qm", "one"],  # noqa: S607
        check=True,
        env=env,
    )
    root = tmp_path / "served"
    root.mkdir()
    subprocess.run(  # noqa: S603
        ["git", "clone", "-q", "--bare", str(work), str(root / "x.git")],  # noqa: S607
        check=True,
        env=env,
    )
    return root


def test_token_goes_to_the_github_prefix_only(canary: str, tmp_path: Path) -> None:
    with http_server() as (base, recorder):
        url = base + "x.git"
        # Positive control: with the server's own URL as the token's prefix, git sends it.
        sending = GitRunner(token=SecretStr(canary), token_prefix=base, author=AUTHOR)
        with pytest.raises(AutopilotError):
            sending.run(["ls-remote", "--end-of-options", url], tmp_path, url=url)
        assert carries(recorder, canary), recorder.seen
        recorder.seen.clear()
        # The GitHub prefix: another host never gets it, through the runner or GitWork.
        runner = GitRunner(token=SecretStr(canary), author=AUTHOR)
        with pytest.raises(AutopilotError):
            runner.run(["ls-remote", "--end-of-options", url], tmp_path, url=url)
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            state_dir=tmp_path / "state",
            forge="github",
            github_token=SecretStr(canary),
        )
        work = GitWork(settings)
        with pytest.raises(AutopilotError):
            work.remote_head(url, "main")
        with pytest.raises(AutopilotError):
            work.fetch("p", url)
    assert len(recorder.seen) >= 3, recorder.seen  # git did reach the server each time
    assert not carries(recorder, canary), recorder.authorizations()


def test_token_does_not_follow_a_redirect_to_another_host(
    canary: str, tmp_path: Path, served_repo: Path
) -> None:
    """The token's host answers with a redirect to a server elsewhere that speaks git: the
    fetch may go on there, but without the token."""
    with http_server("127.0.0.2", backend=served_repo) as (elsewhere, recorder):
        # Positive control: the backend serves the repository (and gets the token when the
        # token is meant for it).
        direct = GitRunner(token=SecretStr(canary), token_prefix=elsewhere, author=AUTHOR)
        listed = direct.run(
            ["ls-remote", "--end-of-options", elsewhere + "x.git"],
            tmp_path,
            url=elsewhere + "x.git",
        )
        assert "refs/heads/main" in listed
        assert carries(recorder, canary)
        recorder.seen.clear()
        with http_server(redirect_to=elsewhere.rstrip("/")) as (github, hops):
            runner = GitRunner(token=SecretStr(canary), token_prefix=github, author=AUTHOR)
            with contextlib.suppress(AutopilotError):
                runner.run(
                    ["ls-remote", "--end-of-options", github + "x.git"],
                    tmp_path,
                    url=github + "x.git",
                )
            assert carries(hops, canary), "the token's own host got it (the test is live)"
    # Without `followRedirects=false` git follows and sends the header with its next request
    # to the new host (the POST), though curl drops it on the redirect hop itself.
    assert urlsplit(elsewhere).hostname != urlsplit(github).hostname
    assert not carries(recorder, canary), [
        (m, p, h.get("authorization")) for m, p, h in recorder.seen
    ]


def test_an_extra_header_keeps_the_safe_git_settings(tmp_path: Path) -> None:
    """The worker token's header (`workers.prepare.control_auth`) is added to the settings
    that keep hooks and fsmonitor off, not put in their place."""
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=tmp_path / "state",
        control_url="http://127.0.0.1:9",
        control_token=SecretStr("worker-token"),
    )
    extra = control_auth(settings, "http://127.0.0.1:9/git/p.git")
    assert extra, "the control URL gets the worker token"
    runner = GitRunner(author=AUTHOR)
    subprocess.run(["git", "init", "-q", str(tmp_path / "r")], check=True)  # noqa: S607
    for key, value in (
        ("core.hooksPath", "/dev/null"),
        ("core.fsmonitor", "false"),
        ("http.http://127.0.0.1:9/.followRedirects", "false"),
    ):
        got = runner.run(["config", "--get", key], tmp_path / "r", extra_env=extra)
        assert got == value, key
    header = runner.run(
        ["config", "--get", "http.http://127.0.0.1:9/.extraHeader"], tmp_path / "r", extra_env=extra
    )
    assert header == "Authorization: Bearer worker-token"
