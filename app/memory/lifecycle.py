"""A finding's lifecycle, a table of the one primitive (`app/statemachine.py`).

A finding is recorded `proposed` (or imported `validated`); only a proposed finding is
validated or refuted; a validated finding changes only by being superseded, when a new finding
that names it in `supersedes` is validated. `service.py` makes every move through
`FINDING.move`, and writes each to `finding_event`.
"""

from __future__ import annotations

from typing import get_args

from app.memory.schemas import Status
from app.statemachine import Lifecycle, Move

#: Every status of a finding.
STATUSES: tuple[str, ...] = get_args(Status)

FINDING = Lifecycle(
    "finding",
    STATUSES,
    (
        Move(("proposed",), ("validated",), "service.validate", "a reviewer confirmed it"),
        Move(("proposed",), ("refuted",), "service.refute", "a reviewer refuted it, saying why"),
        Move(
            ("validated",),
            ("superseded",),
            "service.validate (of the finding that supersedes it)",
            "a new finding that names it in `supersedes` was validated: it replaces this one",
        ),
    ),
    attr="status",
    final=("refuted", "superseded"),
)
