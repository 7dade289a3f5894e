"""The one seam between the read and trigger commands and what answers them.

`cycle run|list|show|cancel`, `campaign start|list|show|stop`, `job list|logs`, `memory
search|show` and `project list` call a `Backend`: `LocalBackend` (this host's stores, as on the
control host) or `RemoteBackend` (the control host's REST API with a bearer token, from a
laptop). Both return the API's JSON shapes, so a command prints the same either way.

Where the API is and which token to send: the root's `--api`/`--token`, then the settings
(`AUTOPILOT_CONTROL_URL`, `AUTOPILOT_TOKEN`), then the file `autopilot login` writes. A URL
without a token is the control host's own (it names where GPU hosts fetch the local forge):
the commands stay local there. An explicit `--api` without a token is an error.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.cli.common import fail, global_flags, load_settings
from app.cli.local import LocalBackend
from app.cli.remote import RemoteBackend
from app.cycles.campaigns.schemas import CampaignCreate
from app.settings import DOTENV, check_control_url, given_settings

Row = dict[str, Any]
Write = Callable[[str], None]


class Backend(Protocol):
    """What the read and trigger commands ask; every answer in the API's JSON shape."""

    def projects(self) -> list[Row]: ...

    def cycles(self, project: str | None, state: str | None, limit: int) -> list[Row]: ...

    def cycle(self, cycle_id: int) -> Row:
        """One cycle with its steps."""
        ...

    def trigger(self, project: str, experiment: str | None, changed: str | None) -> Row: ...

    def cancel_cycle(self, cycle_id: int) -> Row: ...

    def campaigns(self, project: str | None, state: str | None, limit: int) -> list[Row]: ...

    def campaign(self, campaign_id: int) -> Row:
        """One campaign with its steps."""
        ...

    def start_campaign(self, body: CampaignCreate) -> Row:
        """A stored campaign whose driver has been rung."""
        ...

    def stop_campaign(self, campaign_id: int) -> Row: ...

    def jobs(
        self, queue: str | None, state: str | None, project: str | None, limit: int
    ) -> list[Row]: ...

    def job_log(self, job_id: int) -> Iterator[bytes]: ...

    def follow_job(self, job_id: int, write: Write, say: Write) -> str:
        """Stream the job's log to `write` and its progress to `say` until it ends; its state."""
        ...

    def search(
        self,
        query: str,
        project: str | None,
        kind: str | None,
        status: str | None,
        device_kind: str | None,
        limit: int,
    ) -> Row: ...

    def finding(self, finding_id: str) -> Row: ...


# -- where the API is ----------------------------------------------------------------------


@dataclass(frozen=True)
class Remote:
    url: str
    token: str


def config_path() -> Path:
    """The CLI's own file (`autopilot login`): $XDG_CONFIG_HOME/autopilot/config.toml."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "autopilot" / "config.toml"


def read_config() -> dict[str, str]:
    path = config_path()
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        fail(f"{path}: cannot read it ({exc}); run `autopilot login` again or remove it")
    return {k: v for k, v in data.items() if k in ("api", "token") and isinstance(v, str)}


def check_url(url: str, where: str) -> str:
    try:
        return check_control_url(url)
    except ValueError as exc:
        fail(f"{where} {url!r}: {exc}")


def remote_target() -> Remote | None:
    """The API and token the commands use, or None for this host's stores (see the module)."""
    flags, settings, config = global_flags(), load_settings(), read_config()
    given = given_settings()
    if flags.get("api"):
        url = check_url(flags["api"] or "", "--api")
    elif "control_url" in given and not settings.control_url_built:  # an empty one: unset
        url = settings.control_url
    elif config.get("api"):
        url = check_url(config["api"], str(config_path()))
    else:
        return None
    token = flags.get("token") or (settings.token.get_secret_value() if settings.token else "")
    token_from = "--token" if flags.get("token") else given.get("token")
    # A `.env` is read from the working directory, which may be a research repo's checkout: a
    # token from elsewhere (the environment, --token) is not sent where such a file says.
    url_from = "--api" if flags.get("api") else given.get("control_url")
    if token and url_from == DOTENV and token_from != DOTENV:
        fail(
            f"AUTOPILOT_CONTROL_URL ({url}) comes from ./.env, the token does not: the token "
            "is not sent to an address a file in the working directory names; pass --api, set "
            "AUTOPILOT_CONTROL_URL in the environment, or run elsewhere"
        )
    if not token and config.get("api", "").rstrip("/") == url:
        token = config.get("token", "")  # a saved token goes only to the API it was saved for
    if token:
        return Remote(url, token)
    if flags.get("api"):
        fail(
            f"no token for {url}: run `autopilot login --api {url}`, set AUTOPILOT_TOKEN or "
            "pass --token"
        )
    return None


def choose() -> Backend:
    """The backend for this invocation: remote when a token for an API is at hand."""
    target = remote_target()
    if target is None:
        return LocalBackend()
    return RemoteBackend(target.url, target.token)
