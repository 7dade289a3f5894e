"""All SQL of local pull requests. Repositories only flush; the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.forge.models import PullRequestComment, PullRequestRecord


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
