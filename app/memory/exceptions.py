"""Errors of research memory: each names the finding, field or line that was wrong."""

from app.errors import Conflict, InvalidInput, NotFound


class FindingNotFound(NotFound):
    slug = "finding-not-found"
    title = "Finding not found"


class FindingExists(Conflict):
    slug = "finding-exists"
    title = "Finding already recorded"


class CannotSupersede(InvalidInput):
    """A new finding names in `supersedes` one that is not validated. (An illegal move of a
    finding itself is `app.statemachine.IllegalMove`.)"""

    slug = "illegal-transition"
    title = "Status change not allowed"


class InvalidImport(InvalidInput):
    slug = "invalid-import"
    title = "Import file not usable"


class ImportTooLarge(InvalidImport):
    status = 413
    slug = "import-too-large"
    title = "Import file too large"
