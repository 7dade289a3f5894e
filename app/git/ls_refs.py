"""A branch's tip on a git smart-HTTP server, asked with one protocol-v2 `ls-refs` request and no
git process: a GPU host asks the control host's forge before a job whose commit its mirror
already holds (`workers/prepare.py`), where a fetch (`git fetch`, `git-remote-http`, the
connectivity check, then `rev-parse` and `merge-base`; two CGI requests on the API) would bring
nothing. Protocol: gitprotocol-v2(5) and gitprotocol-http(5), pkt-lines over one POST.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from app.git.runner import check_branch_name

#: A branch's tip, looked up again on every job: a short wait, then the fetch path decides.
TIMEOUT = httpx.Timeout(10.0, connect=5.0)


class TipUnknown(Exception):
    """The server did not answer `ls-refs` as protocol v2 says (the caller fetches instead)."""


def pkt(line: bytes) -> bytes:
    return b"%04x" % (len(line) + 4) + line


def branch_tip(
    client: httpx.Client, url: str, branch: str, headers: Mapping[str, str]
) -> str | None:
    """The commit `branch` of the repository at `url` (`.../<name>.git`) points at, or None
    where it has no such branch. Raises TipUnknown for any other answer (its message is
    the status or the error's type: never a header, so never the token)."""
    check_branch_name(branch)
    ref = f"refs/heads/{branch}"
    body = pkt(b"command=ls-refs\n") + b"0001" + pkt(f"ref-prefix {ref}\n".encode()) + b"0000"
    try:
        response = client.post(
            url.rstrip("/") + "/git-upload-pack",
            content=body,
            headers={
                **headers,
                "Content-Type": "application/x-git-upload-pack-request",
                "Accept": "application/x-git-upload-pack-result",
                "Git-Protocol": "version=2",
            },
            timeout=TIMEOUT,
        )
    except httpx.HTTPError as exc:
        raise TipUnknown(type(exc).__name__) from None
    if response.status_code != 200:
        raise TipUnknown(f"HTTP {response.status_code}")
    return _tip(response.content, ref)


def _tip(data: bytes, ref: str) -> str | None:
    tip = None
    at = 0
    while True:
        try:
            size = int(data[at : at + 4], 16)
        except ValueError:
            raise TipUnknown("not a pkt-line answer") from None
        if size == 0:  # flush: the end of the list
            return tip
        if size in (1, 2):  # a delimiter or a response end: no payload
            at += 4
            continue
        if size < 4 or at + size > len(data):
            raise TipUnknown("a truncated pkt-line")
        line = data[at + 4 : at + size].rstrip(b"\n").decode(errors="replace")
        at += size
        if line.startswith("ERR "):
            raise TipUnknown(line[:200])
        sha, _, name = line.partition(" ")
        if name.split(" ", 1)[0] == ref:
            tip = sha
