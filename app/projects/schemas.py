"""Validated shapes of ops input and output: the API and the CLI share them."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.clock import UtcDatetime

SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
SLUG_FORM = "a slug: lower-case letters, digits, '.', '_' or '-', starting with a letter or digit, at most 64 characters"  # noqa: E501
Scope = Literal["trigger", "review", "admin", "worker"]
SCOPES: tuple[Scope, ...] = ("trigger", "review", "admin", "worker")
# A GPU host's token: it fetches from the forge over HTTP (and, later, reads its jobs); it
# reads nothing else, so a token holding only this scope is refused by the other routes.
WORKER_SCOPES: frozenset[str] = frozenset({"worker"})
# Transports git may use for a project's repository. `ext::` and `fd::` run commands; never.
ALLOWED_URL_SCHEMES = ("https://", "http://", "ssh://", "git://", "file://")
_SCP_LIKE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^:]")


def check_slug(value: str, field: str = "name") -> str:
    if not SLUG.fullmatch(value):
        raise ValueError(f"{field} {value!r} is not {SLUG_FORM}")
    return value


def check_repo_url(value: str) -> str:
    if not value or value.startswith("-"):
        raise ValueError("repo_url must not be empty or start with '-'")
    if any(ch in value for ch in "\n\r\0"):
        raise ValueError("repo_url must be one line")
    if value.startswith("/") or value.startswith(ALLOWED_URL_SCHEMES) or _SCP_LIKE.match(value):
        return value
    raise ValueError(
        "repo_url must be an absolute path or a URL with one of "
        f"{', '.join(s.rstrip(':/') for s in ALLOWED_URL_SCHEMES)} (or user@host:path)"
    )


def refuse_credentials(url: str) -> str:
    """A registered repository URL is shown to every token holder and kept in git configs and
    logs: it may name an SSH user, never carry a secret."""
    scheme, _, rest = url.partition("://")
    authority = rest.split("/", 1)[0]
    if not rest or "@" not in authority:
        return url
    userinfo = authority.rsplit("@", 1)[0]
    if scheme == "ssh" and ":" not in userinfo:
        return url  # ssh://git@host/...: a login name, the key stays in the SSH agent
    raise ValueError(
        "repo_url must not carry credentials (user:password@ or token@ in the URL); register "
        "the plain URL and give git its credentials on the control host instead: "
        "AUTOPILOT_GITHUB_TOKEN for GitHub, a git credential helper, or an SSH key"
    )


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Project slug, e.g. spectral-operator-compiler")
    repo_url: str = Field(description="Absolute path or git URL of the research repository")
    default_branch: str = Field(default="main", min_length=1, max_length=255)
    forge: Literal["local", "github"] = "local"
    gpu_kind: str = Field(default="cpu")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_slug(value)

    @field_validator("gpu_kind")
    @classmethod
    def _gpu_kind(cls, value: str) -> str:
        return check_slug(value, "gpu_kind")

    @field_validator("repo_url")
    @classmethod
    def _repo_url(cls, value: str) -> str:
        return refuse_credentials(check_repo_url(value))

    @field_validator("default_branch")
    @classmethod
    def _branch(cls, value: str) -> str:
        if value.startswith("-") or ".." in value or any(c in value for c in " ~^:?*[\\\0"):
            raise ValueError(f"default_branch {value!r} is not a valid git branch name")
        return value


class ProjectOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    repo_url: str
    default_branch: str
    forge: str
    gpu_kind: str
    created_at: UtcDatetime


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    scopes: list[str]
    created_at: UtcDatetime
    revoked_at: UtcDatetime | None
