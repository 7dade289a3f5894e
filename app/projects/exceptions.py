"""Errors of the ops domain."""

from app.errors import Conflict, NotFound


class ProjectExists(Conflict):
    slug = "project-exists"
    title = "Project already exists"


class ProjectNotFound(NotFound):
    slug = "project-not-found"
    title = "Project not found"


class TokenExists(Conflict):
    slug = "token-exists"
    title = "Token name already used"


class TokenNotFound(NotFound):
    slug = "token-not-found"
    title = "Token not found"
