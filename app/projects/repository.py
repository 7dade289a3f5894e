"""All SQL of projects and tokens. Repositories only flush; the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete as delete_rows
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from app.projects.models import ApiToken, Project, SigninSession


def get_project(session: Session, name: str) -> Project | None:
    return session.scalars(select(Project).where(Project.name == name)).one_or_none()


def get_project_by_id(session: Session, project_id: int) -> Project | None:
    return session.get(Project, project_id)


def list_projects(session: Session) -> Sequence[Project]:
    return session.scalars(select(Project).order_by(Project.name)).all()


def add(session: Session, row: Project | ApiToken) -> None:
    session.add(row)
    session.flush()


def delete(session: Session, row: Project | ApiToken) -> None:
    session.delete(row)
    session.flush()


def get_token(session: Session, token_id: int) -> ApiToken | None:
    return session.get(ApiToken, token_id)


def get_token_by_hash(session: Session, digest: str) -> ApiToken | None:
    return session.scalars(select(ApiToken).where(ApiToken.token_sha256 == digest)).one_or_none()


def get_token_by_name(session: Session, name: str) -> ApiToken | None:
    return session.scalars(select(ApiToken).where(ApiToken.name == name)).one_or_none()


def list_tokens(session: Session) -> Sequence[ApiToken]:
    return session.scalars(select(ApiToken).order_by(ApiToken.name)).all()


# -- asked by cycles ----


def on_autopilot(session: Session) -> Sequence[Project]:
    """The projects whose schedule is switched on."""
    return session.scalars(select(Project).where(Project.autopilot_enabled.is_(True))).all()


def add_signin(session: Session, row: SigninSession) -> None:
    session.add(row)
    session.flush()


def prune_signins(session: Session, before: datetime) -> None:
    """Forget the sign-ins that lapsed (expired or ended) before `before`."""
    session.execute(
        delete_rows(SigninSession)
        .where(or_(SigninSession.expires_at < before, SigninSession.ended_at < before))
        # No evaluation in Python of rows this session holds (SQLite's naive datetimes would
        # not compare with `before`); none is read after this in the session.
        .execution_options(synchronize_session=False)
    )


def get_signin(session: Session, digest: str) -> SigninSession | None:
    return session.get(SigninSession, digest)


def end_signins_of(session: Session, token_id: int, at: datetime) -> None:
    session.execute(
        update(SigninSession)
        .where(SigninSession.token_id == token_id, SigninSession.ended_at.is_(None))
        .values(ended_at=at)
    )
