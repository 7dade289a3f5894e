"""The errors of cycles, each with its status and stable problem type."""

from __future__ import annotations

from app.errors import AutopilotError, Conflict, NotFound


class CycleNotFound(NotFound):
    slug = "cycle-not-found"
    title = "Cycle not found"


class NothingToPlot(NotFound):
    """A project without the cycles a chart needs (none yet, or none of that experiment)."""

    slug = "nothing-to-plot"
    title = "Nothing to plot"


class TooManyCycles(AutopilotError):
    status = 429
    slug = "too-many-cycles"
    title = "Too many unfinished cycles"


class CycleFinished(Conflict):
    slug = "cycle-finished"
    title = "Cycle already ended"


class NotAwaitingReview(Conflict):
    slug = "not-awaiting-review"
    title = "Cycle is not awaiting review"


class Transient(Exception):
    """A step failed for a reason that may pass (a push, the forge, the broker): retry later."""


class Unjudgeable(AutopilotError):
    """A result the control plane cannot judge (docs/design.md, "The code under test never judges
    itself"): its raw samples or accuracy figures
    are missing or malformed. The cycle fails; the self-reported verdict is never used."""

    status = 422
    slug = "unjudgeable-result"
    title = "Result cannot be judged"
