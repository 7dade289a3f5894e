"""All SQL of local pull requests. Repositories only flush; the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.forge.models import PullRequestComment, PullRequestRecord, WebhookDelivery


def find_open_by_head(session: Session, project: str, head: str) -> PullRequestRecord | None:
    return session.scalars(
        select(PullRequestRecord).where(
            PullRequestRecord.project == project,
            PullRequestRecord.head == head,
            PullRequestRecord.state == "open",
        )
    ).one_or_none()


def get(session: Session, project: str, number: int) -> PullRequestRecord | None:
    return session.scalars(
        select(PullRequestRecord).where(
            PullRequestRecord.project == project, PullRequestRecord.number == number
        )
    ).one_or_none()


def next_number(session: Session, project: str) -> int:
    current = session.scalar(
        select(func.max(PullRequestRecord.number)).where(PullRequestRecord.project == project)
    )
    return int(current or 0) + 1


def list_for_project(session: Session, project: str) -> Sequence[PullRequestRecord]:
    return session.scalars(
        select(PullRequestRecord)
        .where(PullRequestRecord.project == project)
        .order_by(PullRequestRecord.number)
    ).all()


def comments(session: Session, pull_request_id: int) -> Sequence[PullRequestComment]:
    return session.scalars(
        select(PullRequestComment)
        .where(PullRequestComment.pull_request_id == pull_request_id)
        .order_by(PullRequestComment.id)
    ).all()


def add(session: Session, row: PullRequestRecord | PullRequestComment) -> None:
    session.add(row)
    session.flush()


# -- webhook deliveries ----


def claim_delivery(session: Session, delivery_id: str, event: str) -> bool:
    """Record a webhook delivery as acted on: True for this caller, False when it was seen
    before (the unique id decides, so two concurrent deliveries of one id have one winner)."""
    try:
        with session.begin_nested():
            session.add(WebhookDelivery(delivery_id=delivery_id, event=event[:64]))
    except IntegrityError:
        return False
    return True


def forget_delivery(session: Session, delivery_id: str) -> None:
    """Drop a claimed delivery whose action failed, so GitHub's redelivery acts on it."""
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.delivery_id == delivery_id))


def prune_deliveries(session: Session, before: datetime) -> int:
    """Forget deliveries received before `before`; how many went."""
    result = session.execute(delete(WebhookDelivery).where(WebhookDelivery.received_at < before))
    return int(getattr(result, "rowcount", 0) or 0)
