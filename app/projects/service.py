"""Projects and API tokens: the operations the API and the CLI call."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta

from sqlalchemy import event
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.clock import aware, utcnow
from app.errors import Forbidden, InvalidInput, Unauthorized
from app.projects import repository
from app.projects.exceptions import ProjectExists, ProjectNotFound, TokenExists, TokenNotFound
from app.projects.models import ApiToken, Project, SigninSession
from app.projects.schemas import SCOPES, WORKER_SCOPES, ProjectCreate, check_slug

TOKEN_PREFIX = "ap_"  # noqa: S105 - a prefix, not a secret
#: How long a lapsed (expired or ended) dashboard sign-in is kept before it is deleted.
SIGNIN_KEPT_S = 7 * 24 * 3600.0


def create_project(session: Session, data: ProjectCreate) -> Project:
    if repository.get_project(session, data.name) is not None:
        raise ProjectExists(f"project {data.name!r} already exists; pick another name")
    project = Project(**data.model_dump())
    try:
        with session.begin_nested():
            repository.add(session, project)
    except IntegrityError:  # a concurrent create won the race
        raise ProjectExists(f"project {data.name!r} already exists; pick another name") from None
    return project


def get_project(session: Session, name: str) -> Project:
    project = repository.get_project(session, name)
    if project is None:
        raise ProjectNotFound(f"no project named {name!r}; list them with GET /api/v1/projects")
    return project


def get_project_by_id(session: Session, project_id: int) -> Project:
    project = repository.get_project_by_id(session, project_id)
    if project is None:
        raise ProjectNotFound(f"no project with id {project_id}")
    return project


def list_projects(session: Session) -> Sequence[Project]:
    return repository.list_projects(session)


def project_names(session: Session) -> dict[int, str]:
    """Every project's name by its id."""
    return {p.id: p.name for p in repository.list_projects(session)}


def set_budgets(
    session: Session,
    project: Project,
    *,
    gpu_hours_per_day: float | None,
    concurrent_gpus: int | None,
) -> None:
    """The project's two GPU limits (docs/design.md, "Separate budgets for average and peak");
    None lifts a limit."""
    project.budget_gpu_hours_per_day = gpu_hours_per_day
    project.budget_concurrent_gpus = concurrent_gpus
    session.flush()


def delete_project(session: Session, name: str) -> None:
    repository.delete(session, get_project(session, name))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(session: Session, name: str, scopes: Iterable[str]) -> tuple[ApiToken, str]:
    """Store a new token's hash; return the row and the token, which is never stored."""
    try:
        check_slug(name, "token name")
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    wanted = sorted(set(scopes))
    unknown = [s for s in wanted if s not in SCOPES]
    if unknown or not wanted:
        raise InvalidInput(
            f"scope {', '.join(unknown) or '(none)'} is not valid; expected one or more of "
            f"{', '.join(SCOPES)}"
        )
    if repository.get_token_by_name(session, name) is not None:
        raise TokenExists(f"a token named {name!r} exists; revoke it or pick another name")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, scopes=wanted, token_sha256=_digest(token))
    repository.add(session, row)
    return row, token


def list_tokens(session: Session) -> Sequence[ApiToken]:
    return repository.list_tokens(session)


def get_token(session: Session, token_id: int) -> ApiToken | None:
    """The token row with this id, revoked or not (a dashboard session names its token's id)."""
    return repository.get_token(session, token_id)


def revoke_token(session: Session, name: str) -> ApiToken:
    row = repository.get_token_by_name(session, name)
    if row is None:
        raise TokenNotFound(f"no token named {name!r}")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        repository.end_signins_of(session, row.id, row.revoked_at)  # its dashboard sessions too
        session.flush()
    # This process honours it at once (again once it is committed: a check that read the token
    # as live before that is not cached); others within their cache's TTL.
    VERIFIED.clear()
    event.listen(session, "after_commit", lambda _session: VERIFIED.clear(), once=True)
    return row


def start_signin(session: Session, token: ApiToken, lifetime_s: float) -> str:
    """A dashboard sign-in for `token`: the id its cookie carries (only its sha256 is kept).
    Sign-ins that lapsed over SIGNIN_KEPT_S ago are forgotten here, so the table stays the size
    of the recent ones."""
    sid = secrets.token_urlsafe(32)
    now = utcnow()
    repository.prune_signins(session, now - timedelta(seconds=SIGNIN_KEPT_S))
    repository.add_signin(
        session,
        SigninSession(
            id=_digest(sid),
            token_id=token.id,
            created_at=now,
            expires_at=now + timedelta(seconds=lifetime_s),
        ),
    )
    return sid


def live_signin(session: Session, sid: str, token_id: int) -> bool:
    """Whether the sign-in `sid` of `token_id` is still on: not ended, not expired."""
    row = repository.get_signin(session, _digest(sid))
    if row is None or row.token_id != token_id or row.ended_at is not None:
        return False
    expires = aware(row.expires_at)
    return expires is not None and expires > utcnow()


def end_signin(session: Session, sid: str) -> None:
    """Logout: the sign-in ends on the server, whatever becomes of its cookie."""
    row = repository.get_signin(session, _digest(sid))
    if row is not None and row.ended_at is None:
        row.ended_at = utcnow()
        session.flush()


def authenticate(session: Session, token: str | None) -> ApiToken:
    """The live token row for a presented bearer token, or Unauthorized."""
    if not token:
        raise Unauthorized("missing bearer token; send 'Authorization: Bearer <token>'")
    digest = _digest(token)
    row = repository.get_token_by_hash(session, digest)
    # The lookup is by hash, so timing reveals nothing of the token; compare again anyway in
    # constant time so a future lookup change cannot turn into a timing oracle.
    if row is None or not hmac.compare_digest(row.token_sha256, digest):
        raise Unauthorized("invalid or unknown token")
    if row.revoked_at is not None:
        raise Unauthorized("this token was revoked; create a new one with autopilot token create")
    return row


class VerifiedTokens:
    """Tokens this process verified recently, by the sha256 of the token: a request presenting
    one within `ttl_s` of its check skips the database (the trigger path's busiest query).

    Only live tokens are kept, never the token itself. A revocation made in this process clears
    the cache at once; one made elsewhere (the CLI, another API process) takes effect here within
    `ttl_s` (AUTOPILOT_TOKEN_CACHE_S; 0 turns the cache off)."""

    MAX_ENTRIES = 1024  # bounded: a full cache is emptied, not grown

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, ApiToken]] = {}
        self.generation = 0  # moves at every clear: a check begun before it is not kept

    def get(self, digest: str) -> ApiToken | None:
        entry = self._entries.get(digest)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, digest: str, token: ApiToken, ttl_s: float, generation: int) -> None:
        with self._lock:
            if generation != self.generation:  # cleared since the check began
                return
            if len(self._entries) >= self.MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = (time.monotonic() + ttl_s, token)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.generation += 1


VERIFIED = VerifiedTokens()


def recently_verified(token: str | None, ttl_s: float) -> ApiToken | None:
    """The token's row when this process verified it in the last `ttl_s` seconds, else None."""
    return VERIFIED.get(_digest(token)) if token and ttl_s > 0 else None


def authenticate_cached(
    open_session: Callable[[], AbstractContextManager[Session]],
    token: str | None,
    ttl_s: float,
) -> ApiToken:
    """`authenticate`, answered from `VERIFIED` when this token was verified in the last
    `ttl_s` seconds; otherwise checked in a session of its own (detached: read-only). The row is
    shared between requests: read it, never change it."""
    cached = recently_verified(token, ttl_s)
    if cached is not None:
        return cached
    generation = VERIFIED.generation
    with open_session() as session:
        row = authenticate(session, token)
        session.expunge(row)
    if ttl_s > 0:
        VERIFIED.put(row.token_sha256, row, ttl_s, generation)
    return row


def require_scope(token: ApiToken, scope: str) -> None:
    """`admin` holds every scope; otherwise the token must carry the scope itself."""
    if scope not in token.scopes and "admin" not in token.scopes:
        raise Forbidden(f"this action needs scope {scope!r}; the token has {token.scopes}")


def require_reader(token: ApiToken) -> None:
    """Any scope but `worker` reads the API; a GPU host's worker token reads only the forge."""
    if set(token.scopes) <= WORKER_SCOPES:
        raise Forbidden(
            f"a token with scopes {token.scopes} may only fetch from the forge over HTTP; "
            "use a token with scope trigger, review or admin"
        )


# -- asked by cycles ----


def find_project_by_id(session: Session, project_id: int) -> Project | None:
    """A project by its row id (a cycle or job names its project so), or None if it is gone."""
    return repository.get_project_by_id(session, project_id)


def on_autopilot(session: Session) -> Sequence[Project]:
    """The projects whose schedule is switched on."""
    return repository.on_autopilot(session)
