"""What people are told when a cycle needs one of them: it awaits review, or it failed (its
error says what to fix). Sent through `app.notify`, off the cycle's path."""

from __future__ import annotations

import logging

from app import notify
from app.cycles import service
from app.cycles.headline import ratio_text
from app.db import Stores
from app.settings import Settings

log = logging.getLogger(__name__)

#: The states a cycle reaches that a person acts on.
NEWS = ("awaiting_review", "failed")


def text(stores: Stores, settings: Settings, cycle_id: int) -> str | None:
    """The message for the cycle's state, or None where its state is no news."""
    with stores.ops_session() as session:
        cycle = service.get(session, cycle_id)
        project = service.project_of(session, cycle).name
        page = f"{settings.dashboard_base_url}/cycles/{cycle.id}"
        if cycle.state == "awaiting_review":
            pr = f" · pull request: {cycle.pr_url}" if cycle.pr_url else ""
            return (
                f"Cycle {cycle.id} of {project} awaits review: {cycle.experiment}, "
                f"{cycle.verdict or 'no verdict'} ({ratio_text(cycle.headline)}). "
                f"Decide on {page}{pr}"
            )
        if cycle.state == "failed":
            error = (cycle.error or "no error recorded")[:1000]
            return f"Cycle {cycle.id} of {project} failed: {error}. See {page}"
    return None


def announce(stores: Stores, settings: Settings, cycle_id: int, state: str) -> None:
    """Tell people, where a receiver is configured and `state` is news; never raises: a
    notification must not stop the cycle."""
    if state not in NEWS or settings.notify_url is None:
        return
    try:
        message = text(stores, settings, cycle_id)
        if message:
            notify.announce(settings, message)
    except Exception:
        log.exception("cycle %s: no notification", cycle_id)
