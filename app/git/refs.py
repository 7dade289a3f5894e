"""A cycle's branch: its name (`autopilot/<project>/<cycle-short-id>-<slug>`), the base commit
it started from, and the checks a name or a sha passes before it reaches git."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from app.git.exceptions import InvalidRef
from app.git.runner import check_branch_name
from app.projects import schemas as ops_schemas

REMOTE_PREFIX = "refs/remotes/origin/"
BRANCH_PREFIX = "autopilot"
_SHORT_ID = re.compile(r"^[A-Za-z0-9]{1,40}$")
_SLUG_CHARS = re.compile(r"[^a-z0-9]+")


def slugify(text: str, limit: int = 40) -> str:
    """A branch-safe slug of free text (a hypothesis title): lower case, digits and '-'."""
    slug = _SLUG_CHARS.sub("-", text.lower()).strip("-")[:limit].strip("-")
    return slug or "change"


def short_id(cycle_id: str | int) -> str:
    value = str(cycle_id).replace("-", "")
    if str(cycle_id).startswith("-") or not _SHORT_ID.fullmatch(value):
        raise InvalidRef(f"cycle id {cycle_id!r} must be letters and digits")
    return value[:8].lower()


def branch_name(project: str, cycle_id: str | int, slug: str) -> str:
    """`autopilot/<project>/<cycle-short-id>-<slug>`, validated."""
    try:
        ops_schemas.check_slug(project, "project")
    except ValueError as exc:
        raise InvalidRef(str(exc)) from None
    return check_branch_name(f"{BRANCH_PREFIX}/{project}/{short_id(cycle_id)}-{slugify(slug)}")


@dataclass(frozen=True)
class CycleBranch:
    """A cycle's branch in the project's mirror and the base commit it started from."""

    project: str
    branch: str
    base: str
    base_sha: str
    mirror: Path

    @property
    def ref(self) -> str:
        return f"refs/heads/{self.branch}"


def check_sha(value: str) -> str:
    if len(value) < 7 or len(value) > 64 or not all(c in "0123456789abcdef" for c in value):
        raise InvalidRef(f"{value!r} is not a commit sha")
    return value
