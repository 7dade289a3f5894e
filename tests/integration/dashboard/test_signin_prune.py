"""Dashboard sign-ins are rows: the lapsed ones are forgotten, the live ones kept."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.clock import aware, utcnow
from app.db import Stores
from app.projects import service as ops
from app.projects.models import SigninSession


def test_a_new_sign_in_forgets_those_that_lapsed_a_week_ago(stores: Stores) -> None:
    with stores.ops_session() as session:
        token, _ = ops.create_token(session, "reviewer", ["review"])
        token_id = token.id
        live = ops.start_signin(session, token, 3600)
        for _ in range(3):
            ops.start_signin(session, token, 3600)
        recent_ended = ops.start_signin(session, token, 3600)
        ops.end_signin(session, recent_ended)
    long_ago = utcnow() - timedelta(seconds=ops.SIGNIN_KEPT_S + 3600)
    with stores.ops_session() as session:
        rows = session.scalars(select(SigninSession).where(SigninSession.ended_at.is_(None)))
        _live, expired, ended, _unchanged = sorted(rows, key=lambda r: r.created_at)
        expired.expires_at = long_ago
        ended.ended_at = long_ago

    with stores.ops_session() as session:
        token = ops.get_token(session, token_id)
        assert token is not None
        newest = ops.start_signin(session, token, 3600)
    cutoff = utcnow() - timedelta(seconds=ops.SIGNIN_KEPT_S)
    with stores.ops_session() as session:
        kept = list(session.scalars(select(SigninSession)))
        assert len(kept) == 4  # of six: the two that lapsed a week ago are gone
        assert all(aware(r.expires_at) > cutoff for r in kept)  # type: ignore[operator]
        assert all(r.ended_at is None or aware(r.ended_at) > cutoff for r in kept)  # type: ignore[operator]
        assert ops.live_signin(session, live, token_id)
        assert ops.live_signin(session, newest, token_id)
        assert not ops.live_signin(session, recent_ended, token_id)
