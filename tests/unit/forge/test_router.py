"""The HTTP forge's pure parts: which requests are served, where the token is, the CGI's
environment (nothing of the service's) and the parsing of its headers."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest

from app.errors import NotFound
from app.forge.exceptions import ForgeBackendFailed, ForgeReadOnly
from app.forge.router import Target, cgi_environment, parse_cgi_head, presented_token, service_of


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer ap_abc", "ap_abc"),
        ("bearer   ap_abc ", "ap_abc"),
        (f"Basic {b64('gpu-1:ap_abc')}", "ap_abc"),
        (f"Basic {b64(':ap_abc')}", "ap_abc"),
        (f"Basic {b64('user:pa:ss')}", "pa:ss"),
        (f"Basic {b64('user:')}", None),
        (f"Basic {b64('no-colon')}", None),
        ("Basic %%%", None),
        ("Bearer ", None),
        ("Digest x", None),
        ("", None),
        (None, None),
    ],
)
def test_presented_token(header: str | None, token: str | None) -> None:
    assert presented_token(header) == token


def test_only_fetch_is_served_and_push_refused() -> None:
    assert service_of("GET", "info/refs", "git-upload-pack") == "info/refs"
    assert service_of("POST", "git-upload-pack", None) == "git-upload-pack"
    for method, rest, service in [
        ("GET", "info/refs", "git-receive-pack"),
        ("POST", "git-receive-pack", None),
        ("GET", "git-receive-pack", None),
    ]:
        with pytest.raises(ForgeReadOnly):
            service_of(method, rest, service)
    for method, rest, service in [
        ("GET", "info/refs", None),
        ("POST", "info/refs", "git-upload-pack"),
        ("GET", "git-upload-pack", None),
        ("GET", "HEAD", None),
        ("GET", "objects/info/packs", None),
        ("DELETE", "git-upload-pack", None),
    ]:
        with pytest.raises(NotFound):
            service_of(method, rest, service)


def test_cgi_environment_is_built_from_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOPILOT_GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv("GIT_DIR", "/elsewhere")
    target = Target(Path("/state/forge"), "/spectral.git/git-upload-pack", "")
    headers = {
        "content-encoding": "gzip",
        "git-protocol": "version=2",
        "authorization": "Bearer ap_x",
        "cookie": "autopilot_session=x",
    }
    env = cgi_environment(target, "POST", "application/x-git-upload-pack-request", 42, headers)
    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/state/forge",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PROJECT_ROOT": "/state/forge",
        "GIT_HTTP_EXPORT_ALL": "1",
        "PATH_INFO": "/spectral.git/git-upload-pack",
        "QUERY_STRING": "",
        "REQUEST_METHOD": "POST",
        "CONTENT_TYPE": "application/x-git-upload-pack-request",
        "CONTENT_LENGTH": "42",
        "HTTP_CONTENT_ENCODING": "gzip",
        "HTTP_GIT_PROTOCOL": "version=2",
    }
    odd = cgi_environment(target, "GET", "", 0, {"git-protocol": "version=2\nGIT_DIR=/x"})
    assert "HTTP_GIT_PROTOCOL" not in odd and "CONTENT_LENGTH" not in odd


def test_parse_cgi_head() -> None:
    stream = io.BytesIO(b"Status: 403 Forbidden\r\nContent-Type: text/plain\r\n\r\nbody")
    assert parse_cgi_head(stream) == (403, [("Content-Type", "text/plain")])
    assert stream.read() == b"body"
    stream = io.BytesIO(b"Expires: Fri, 01 Jan 1980\nContent-Type: x\n\nPACK")
    assert parse_cgi_head(stream) == (200, [("Expires", "Fri, 01 Jan 1980"), ("Content-Type", "x")])
    for broken in (b"", b"Content-Type: x\r\n", b"no colon\r\n\r\n", b"Status: abc\r\n\r\n"):
        with pytest.raises(ForgeBackendFailed):
            parse_cgi_head(io.BytesIO(broken))
    with pytest.raises(ForgeBackendFailed):
        parse_cgi_head(io.BytesIO(b"X: " + b"y" * 70_000 + b"\r\n\r\n"))
