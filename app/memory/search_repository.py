"""Full-text search over findings: the SQL, per back end (a repository for search only).

Both back ends give the same meaning: every term of the query appears in the statement as a
substring, case-insensitively, so Korean (no spaces between morphemes) works as English does.
SQLite answers with its FTS5 trigram index, ranked by bm25; terms shorter than three
characters cannot use trigrams and fall back to LIKE. PostgreSQL answers with ILIKE, which
its GIN trigram index serves, ranked by pg_trgm similarity.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, column, func, or_, select, table, text
from sqlalchemy.orm import Session

from app.memory.models import SEARCH_TABLE, Finding

MAX_TERMS = 16
MAX_RELATED_TERMS = 32
TRIGRAM = 3
_WORD = re.compile(r"\w+", re.UNICODE)
# Words too common to say anything about relevance (English only: Korean particles are
# attached to their words, and trigram matching copes with them).
_STOPWORDS = frozenset(
    ("the", "and", "for", "with", "that", "this", "from", "into", "when", "then", "than"),
) | frozenset(("are", "was", "were", "been", "has", "have", "had", "not", "but", "its", "our"))

_fts = table(SEARCH_TABLE, column("rowid"), column("finding_id"), column("rank"))


@dataclass(frozen=True)
class Filters:
    project: str | None = None
    kind: str | None = None
    status: str | None = None
    device_kind: str | None = None


def query_terms(query: str) -> list[str]:
    """Whitespace-separated terms, each kept whole (punctuation included), first 16, unique."""
    seen: dict[str, None] = {}
    for term in query.split():
        seen.setdefault(term, None)
    return list(seen)[:MAX_TERMS]


def text_words(text_: str) -> list[str]:
    """Distinct words of free text worth matching on: three characters or more, no stopword."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text_.lower()):
        if len(word) >= TRIGRAM and word not in _STOPWORDS:
            seen.setdefault(word, None)
    return list(seen)[:MAX_RELATED_TERMS]


def fts_phrase(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def _like_pattern(term: str) -> str:
    escaped = term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _conditions(filters: Filters) -> list[ColumnElement[bool]]:
    conditions = []
    if filters.project is not None:
        conditions.append(Finding.project == filters.project)
    if filters.kind is not None:
        conditions.append(Finding.kind == filters.kind)
    if filters.status is not None:
        conditions.append(Finding.status == filters.status)
    if filters.device_kind is not None:
        conditions.append(Finding.device_kind == filters.device_kind)
    return conditions


def _contains(term: str, postgres: bool) -> ColumnElement[bool]:
    if postgres:
        return Finding.statement.ilike(_like_pattern(term), escape="\\")
    # SQLite's LIKE folds ASCII case only; Hangul has no case.
    return Finding.statement.like(_like_pattern(term), escape="\\")


def _is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def search(
    session: Session, query: str, filters: Filters, limit: int, offset: int
) -> Sequence[Finding]:
    """Up to `limit` findings from `offset`, best first; newest first when the query is empty."""
    terms = query_terms(query)
    postgres = _is_postgres(session)
    stmt = select(Finding).where(*_conditions(filters))
    newest = (Finding.created_at.desc(), Finding.id)
    if not terms:
        stmt = stmt.order_by(*newest)
    elif postgres:
        for term in terms:
            stmt = stmt.where(_contains(term, postgres))
        stmt = stmt.order_by(func.similarity(Finding.statement, query).desc(), *newest)
    else:
        long = [t for t in terms if len(t) >= TRIGRAM]
        for term in (t for t in terms if len(t) < TRIGRAM):
            stmt = stmt.where(_contains(term, postgres))
        if long:
            match = " ".join(fts_phrase(t) for t in long)  # juxtaposed phrases: all must match
            matching = text(f"{SEARCH_TABLE} MATCH :match").bindparams(match=match)
            if stmt.whereclause is None:
                # Nothing to filter on: let FTS5 rank and cut the page itself (its fast path
                # for ORDER BY rank LIMIT), then read only that page's rows.
                # rowid breaks ties in rank, so pages neither overlap nor skip.
                hits = (
                    select(_fts.c.finding_id, _fts.c.rank, _fts.c.rowid)
                    .where(matching)
                    .order_by(_fts.c.rank, _fts.c.rowid)
                    .limit(limit)
                    .offset(offset)
                    .subquery()
                )
                page = select(Finding).join(hits, hits.c.finding_id == Finding.id)
                return session.scalars(page.order_by(hits.c.rank, hits.c.rowid)).all()
            stmt = (
                stmt.join(_fts, _fts.c.finding_id == Finding.id)
                .where(matching)
                .order_by(_fts.c.rank, Finding.id)
            )
        else:
            stmt = stmt.order_by(*newest)
    return session.scalars(stmt.limit(limit).offset(offset)).all()


def related(session: Session, project: str | None, text_: str, k: int) -> list[Finding]:
    """The k validated findings of `project` (and general ones) that best match free text."""
    scope: ColumnElement[bool] = Finding.project.is_(None)
    if project is not None:
        scope = or_(Finding.project == project, scope)
    base = select(Finding).where(Finding.status == "validated", scope)
    words = text_words(text_)
    picked: list[Finding] = []
    if words and _is_postgres(session):
        picked = list(
            session.scalars(
                base.where(or_(*(_contains(w, True) for w in words)))
                .order_by(func.similarity(Finding.statement, text_).desc(), Finding.id)
                .limit(k)
            )
        )
    elif words:
        match = " OR ".join(fts_phrase(w) for w in words)
        picked = list(
            session.scalars(
                base.join(_fts, _fts.c.finding_id == Finding.id)
                .where(text(f"{SEARCH_TABLE} MATCH :match").bindparams(match=match))
                .order_by(_fts.c.rank, Finding.id)
                .limit(k)
            )
        )
    if len(picked) < k:
        # Too few matches: fill with the project's own newest bounds and lessons, which the
        # agent should see anyway, then general ones.
        seen = [f.id for f in picked]
        fill = session.scalars(
            base.where(Finding.id.not_in(seen))
            .order_by(
                Finding.project.is_(None),
                (Finding.kind == "bound").desc(),
                Finding.created_at.desc(),
                Finding.id,
            )
            .limit(k - len(picked))
        )
        picked.extend(fill)
    return picked
