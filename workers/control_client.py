"""The GPU host's client of the control host's API: a job's whole log is handed in when the job
ends (the control host never reads this host's disk; the bounded tail the worker keeps in the
ops DB while the job runs is `app.jobs.logs.tail_text`'s), and a branch's tip is asked of the
forge before a fetch."""

from __future__ import annotations

import functools
import logging
import ssl
from pathlib import Path

import httpx

from app.client import problem_detail, without_token
from app.git import ls_refs
from app.redaction import redact_text
from app.settings import Settings

log = logging.getLogger(__name__)

# The route of app.jobs.router (LOG_ROUTE) under the API's prefix (app.api.main.API_PREFIX),
# written out: importing the API application would load all of it into every GPU worker. The
# loopback test against the real app checks the two agree.
LOG_UPLOAD_PATH = "/api/v1/jobs/{job_id}/log"
# Connecting fails fast; a large log on a slow link may take a while between chunks.
UPLOAD_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS settings httpx would build for each request (its CA bundle read and parsed:
    about 20 ms of CPU, once per job otherwise), built once; an SSLContext is shared safely."""
    return httpx.create_ssl_context()


@functools.cache
def _client() -> httpx.Client:
    """One client for this process's requests to the control host: its connections are kept
    alive between jobs (a client a request cost ~1.5 ms of CPU and a new connection)."""
    return httpx.Client(verify=_tls(), follow_redirects=False)


def control_token(settings: Settings, url: str) -> str | None:
    """The worker token, for a URL of the control host only (another host never sees it)."""
    token = settings.control_token.get_secret_value() if settings.control_token else ""
    return token if token and url.startswith(settings.control_url.rstrip("/") + "/") else None


def branch_unmoved(settings: Settings, url: str, branch: str, sha: str) -> bool:
    """Whether `branch` of the control host's forge at `url` still points at `sha`: one
    `ls-refs` request (`app/git/ls_refs.py`). False on any doubt: the caller fetches."""
    token = control_token(settings, url)
    if token is None:
        return False
    try:
        tip = ls_refs.branch_tip(_client(), url, branch, {"Authorization": f"Bearer {token}"})
    except ls_refs.TipUnknown as exc:
        log.info("the forge's tip of %s was not answered (%s): fetching", branch, exc)
        return False
    return tip == sha


#: What git says when an HTTP remote wants credentials it was not given, or refused them.
_REFUSED = (
    "could not read username",
    "could not read password",
    "authentication failed",
    "returned error: 401",
    "returned error: 403",
)


def fetch_refused_hint(settings: Settings, url: str, detail: str) -> str | None:
    """What to fix when a fetch of `url` failed for want of credentials (git's `could not read
    Username for 'http://...'`), naming the setting; None for any other failure.

    The worker token goes only to URLs under this host's AUTOPILOT_CONTROL_URL: a job's
    repository is `<control URL of the control host>/git/<project>.git`, so the two hosts
    must agree on that URL, or no token is sent at all."""
    if not url.startswith(("http://", "https://")) or not any(
        words in detail.lower() for words in _REFUSED
    ):
        return None
    how = "`autopilot token create --name <this host> --scope worker` on the control host"
    token = settings.control_token.get_secret_value() if settings.control_token else ""
    if control_token(settings, url) is not None:
        return (
            "the control host refused AUTOPILOT_CONTROL_TOKEN (unknown, revoked, or without "
            f"scope worker): set a worker token ({how}); `autopilot doctor gpu-host` checks it"
        )
    if url.startswith(settings.control_url.rstrip("/") + "/"):
        return f"AUTOPILOT_CONTROL_TOKEN is not set on this GPU host: set a worker token ({how})"
    if "/git/" in url and token:
        return (
            f"the repository is not under this host's AUTOPILOT_CONTROL_URL "
            f"({redact_text(settings.control_url)}), so its token was not sent: set "
            "AUTOPILOT_CONTROL_URL to the base URL the control host names its forge with"
        )
    return (
        "the repository wants credentials this host does not have: give the workers' user "
        "read access for git (a deploy key or a credential helper), or, for the control host's "
        "forge, set AUTOPILOT_CONTROL_URL and AUTOPILOT_CONTROL_TOKEN"
    )


class LogUploadFailed(Exception):
    """The control host did not take a job's log. The message names the job, the URL and the
    reason, never the token; `status` is the HTTP status the control host answered, None when
    it did not answer (or the request was never sent)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def upload_log(
    settings: Settings, job_id: int, path: Path, *, timeout: httpx.Timeout = UPLOAD_TIMEOUT
) -> None:
    """Send the job's whole log at `path` to the control host, streamed from the file."""
    token = settings.control_token.get_secret_value() if settings.control_token else ""
    url = settings.control_url + LOG_UPLOAD_PATH.format(job_id=job_id)
    where = f"job {job_id}'s log to {redact_text(url)}"
    if not token:
        raise LogUploadFailed(
            f"cannot upload {where}: AUTOPILOT_CONTROL_TOKEN is not set (a token with scope "
            "worker, from `autopilot token create`)"
        )
    try:
        with open(path, "rb") as body:
            response = _client().put(
                url,
                content=body,
                headers={
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/octet-stream",
                },
                timeout=timeout,
            )
    except FileNotFoundError:
        raise LogUploadFailed(f"cannot upload {where}: {path} does not exist") from None
    except (OSError, httpx.HTTPError) as exc:
        # `from None`: a chained httpx error carries the request, headers and all.
        reason = f"{type(exc).__name__}: {exc}"
        raise LogUploadFailed(without_token(f"cannot upload {where}: {reason}", token)) from None
    if response.status_code >= 400:
        reason = f"HTTP {response.status_code}: {problem_detail(response)}"
        raise LogUploadFailed(
            without_token(f"cannot upload {where}: {reason}", token), response.status_code
        )
