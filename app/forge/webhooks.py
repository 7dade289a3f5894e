"""POST /api/v1/webhooks/github: GitHub's webhook deliveries, thin over `app.forge.decisions`.

No bearer token: a delivery is trusted by its `X-Hub-Signature-256` alone, checked on the raw
body before anything parses it. The body is read with a cap, so an oversized one is refused
(413) without being held whole.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse

from app.api.deps import SettingsDep, StoresDep
from app.forge import decisions
from app.forge.exceptions import WebhookTooLarge

router = APIRouter(prefix="/webhooks", tags=["webhooks"])

#: The largest delivery taken. GitHub's pull_request payloads run to tens of kilobytes (a PR's
#: body is at most 65,536 characters); a larger body is no delivery of ours.
MAX_WEBHOOK_BYTES = 1024 * 1024
ROUTE = "/webhooks/github"


async def raw_body(request: Request) -> bytes:
    """The body as sent, up to MAX_WEBHOOK_BYTES (413 beyond: the declared length is checked
    first, then the bytes as they arrive)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_WEBHOOK_BYTES:
        raise WebhookTooLarge(f"a webhook delivery may hold at most {MAX_WEBHOOK_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_WEBHOOK_BYTES:
            raise WebhookTooLarge(f"a webhook delivery may hold at most {MAX_WEBHOOK_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "Acted on, or acted on before (a delivery id seen again)"},
    202: {"description": "Acknowledged and ignored (another event, repository or PR)"},
    401: {"description": "The signature does not match the body"},
    403: {"description": "An /autopilot command from a user without write access"},
    413: {"description": "The body is larger than 1 MiB"},
    503: {"description": "No webhook secret is set, so no delivery can be verified"},
}


@router.post(ROUTE.removeprefix("/webhooks"), responses=_ANSWERS)
def github_webhook(
    body: Annotated[bytes, Depends(raw_body)],
    settings: SettingsDep,
    stores: StoresDep,
    x_github_event: Annotated[str, Header(max_length=64)] = "",
    x_github_delivery: Annotated[str, Header(max_length=128)] = "",
    x_hub_signature_256: Annotated[str | None, Header(max_length=256)] = None,
) -> JSONResponse:
    """A GitHub webhook delivery: pull_request (merged: approve; closed: reject),
    pull_request_review (shown on the cycle) and issue_comment (`/autopilot approve`,
    `/autopilot reject <reason>`, `/autopilot rerun`, from users with write access)."""
    delivery = decisions.Delivery(
        event=x_github_event,
        delivery_id=x_github_delivery,
        signature=x_hub_signature_256,
        body=body,
    )
    outcome = decisions.receive(stores, settings, delivery)
    return JSONResponse(
        {"outcome": outcome.outcome, "cycle_id": outcome.cycle_id}, status_code=outcome.status
    )
