"""What `autopilot worker gpu` checks before it takes a job, and the line it prints when one fails.

Only what would make every job fail is checked here: the kind, the device nodes, the sandbox
and the worker token. The other checks of a GPU host's settings are `autopilot doctor gpu-host`'s
(`workers.gpu_host`), which this module borrows its checks from.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from app.settings import ENV_PREFIX, Settings
from workers.gpu_host import (
    DEV,
    HOW_TO_GET_ONE,
    HTTP_TIMEOUT_S,
    Check,
    check_devices,
    check_kind,
    check_sandbox,
    check_token,
    masked,
    reason,
)

#: How long a starting worker waits for the API to answer: it may be starting beside it (`make
#: run`, a Kubernetes rollout), and the token is checked against it.
CONTROL_WAIT_S = 10.0


def start_checks(
    settings: Settings,
    kind: str,
    device: str,
    *,
    wait_s: float = CONTROL_WAIT_S,
    dev: Path = DEV,
) -> list[Check]:
    """What `autopilot worker gpu` checks before it takes a job: any that fails is a reason
    not to start, since every job would fail the same way (without the token, each one at
    its preparation, with git's `could not read Username`).

    Only what makes every job fail: the kind, the device nodes, the sandbox, and the worker
    token, which the API must not refuse. The rest of `run_checks` (the state dir, the ops DB,
    the broker, the no-secrets rule) stays the doctor's: a worker that cannot reach its stores
    says so at once anyway, and a one-machine setup (`make run`) holds the control host's
    settings. An API that does not answer within `wait_s` (it may be starting beside the
    worker) is a warning, not a refusal: the GPU host keeps running jobs through a control
    host's outage, and their logs wait in its outbox (docs/operations.md, "Job logs")."""
    checks = [check_kind(settings, kind), check_devices(kind, device, dev)]
    if settings.sandbox == "on":
        checks.append(check_sandbox(settings))
    checks += check_control_at_start(settings, wait_s)
    return masked(settings, checks)


#: The setting (or option) each start check is about, for the worker's one line.
FIX: dict[str, str] = {
    "gpu-kind": "--kind",
    "devices": "--device",
    "sandbox": f"{ENV_PREFIX}SANDBOX",
    "control-url": f"{ENV_PREFIX}CONTROL_URL",
    "control-token": f"{ENV_PREFIX}CONTROL_TOKEN",
}


def refusal(check: Check) -> str:
    """The one line a worker that will not start prints: what to fix, first."""
    setting = FIX.get(check.name, check.name)
    detail = check.detail if setting in check.detail else f"{setting} {check.detail}"
    return f"error: GPU worker not started: {detail}"


def check_control_at_start(settings: Settings, wait_s: float) -> list[Check]:
    """The worker token is set, and the API does not refuse it (once it answers)."""
    token = settings.control_token.get_secret_value() if settings.control_token else ""
    if not token:
        return [
            Check(
                "control-token",
                False,
                f"{ENV_PREFIX}CONTROL_TOKEN is not set: a token with scope worker ("
                f"{ENV_PREFIX}CONTROL_TOKEN=ap_...) fetches each job's code from the control "
                f"host and uploads its log; {HOW_TO_GET_ONE}",
            )
        ]
    url = settings.control_url
    with httpx.Client(base_url=url, timeout=HTTP_TIMEOUT_S, follow_redirects=False) as client:
        answer, why = _await_health(client, wait_s)
        if answer is None:
            return [
                Check(
                    "control-url",
                    True,
                    f"{url}/healthz gave no answer within {wait_s:g} s ({why}): starting "
                    f"anyway; until it answers, jobs fetched from its forge fail and logs wait "
                    f"in the outbox. Check {ENV_PREFIX}CONTROL_URL if it never does "
                    "(`autopilot doctor gpu-host`)",
                    warn=True,
                )
            ]
        if answer.status_code != 200:
            return [
                Check(
                    "control-url",
                    False,
                    f"{ENV_PREFIX}CONTROL_URL: {url}/healthz answered {answer.status_code}, not "
                    "200: set it to the API's base URL",
                )
            ]
        return [check_token(client, url, token, strict=False)]


def _await_health(client: httpx.Client, wait_s: float) -> tuple[httpx.Response | None, str]:
    """`GET /healthz`, tried again while nothing answers (or a proxy says the API is not up
    yet) for up to `wait_s`; (answer or None, why none)."""
    until = time.monotonic() + wait_s
    while True:
        try:
            answer = client.get("/healthz")
            if answer.status_code not in (502, 503, 504):
                return answer, ""
            why = f"HTTP {answer.status_code}"
        except httpx.HTTPError as exc:
            why = reason(exc)
        if time.monotonic() >= until:
            return None, why
        time.sleep(min(1.0, max(0.0, until - time.monotonic())))
