"""`autopilot doctor gpu-host`: a GPU host's settings, each checked against the real services.

A GPU host holds the broker URL, the ops DB URL, the API's URL with a `worker` token, and a state
dir of its own; never a forge credential, the memory DB or the session secret (docs/design.md,
"Hosts and boundaries"). Each check says what is wrong and what to do. No secret value is
printed: every line goes through the same masking as the logs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError
from pydantic_settings import SettingsError
from sqlalchemy.engine import make_url

from app import migrate
from app.logs import RedactSecrets, secret_values
from app.redaction import redact_text, redact_url
from app.sandbox import confined
from app.settings import (
    ENV_PREFIX,
    Settings,
    describe_validation_error,
    given_settings,
)
from workers.launcher import runtime

HTTP_TIMEOUT_S = 5.0
DEV = Path("/dev")
BROKER_TIMEOUT_S = 2.0
# Any project name will do: the forge checks the token before it looks the project up, so a good
# token gets 404 (200 should the project exist), an unknown one 401 and a wrong scope 403.
PROBE_PROJECT = "autopilot-doctor-probe"
HOW_TO_GET_ONE = (
    "create one on the control host: `autopilot token create --name <this host> --scope worker`"
)
# What a GPU host must never hold, and why: untrusted experiment code runs on it.
FORBIDDEN: dict[str, str] = {
    "github_token": "the forge token pushes branches and opens pull requests; only the control "
    "host holds it (with GitHub, this host fetches with read-only credentials of its own)",
    "github_app_private_key": "the GitHub App key mints forge tokens; only the control host "
    "holds it",
    "session_secret": "it signs dashboard sessions: whoever holds it can forge a login",
    "memory_url": "research memory belongs to the control host; nothing on a GPU host reads or "
    "writes it",
}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    #: Passes, but says something to fix (a worker's start prints it as a warning).
    warn: bool = False

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAIL':<4}  {self.name:<14} {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def run_checks(kind: str | None = None, device: str | None = None) -> list[Check]:
    """Every check, in the order a host is set up; secrets masked in every line. `device`
    (a worker's `--device`, e.g. `0,1`) checks its device nodes too."""
    try:
        settings = Settings()
        given = given_settings()
    except ValidationError as exc:
        lines = describe_validation_error(exc)
        return [Check("settings", False, f"{line}; fix it in the env file") for line in lines]
    except SettingsError as exc:  # a list setting that is not JSON
        return [Check("settings", False, f"{redact_text(str(exc))}; fix it in the env file")]
    checks = [Check("settings", True, "the settings load")]
    checks += check_forbidden(settings, given)
    state_dir = check_state_dir(settings, given)
    checks.append(state_dir)
    checks.append(check_broker(settings))
    checks.append(check_ops_db(settings, given))
    checks += check_control(settings, given)
    checks.append(check_git())
    if state_dir.ok:  # runtime dirs may fall back to it
        checks.append(check_runtime(settings))
    checks.append(check_sandbox(settings))
    if kind is not None:
        checks.append(check_kind(settings, kind))
        if device is not None:
            checks.append(check_devices(kind, device))
    return masked(settings, checks)


def masked(settings: Settings, checks: list[Check]) -> list[Check]:
    mask: Callable[[str], str] = RedactSecrets(secret_values(settings)).redact
    return [Check(c.name, c.ok, mask(c.detail), c.warn) for c in checks]


def check_devices(kind: str, device: str, dev: Path = DEV) -> Check:
    """The worker's GPUs exist here: `--device N` names `/dev/nvidiaN` (the driver's minor
    number), the node a sandboxed run is given, and NVIDIA's control node is there."""
    if kind == "cpu":
        return Check("devices", True, "a cpu worker: no GPU device")
    indices = [entry for entry in device.split(",") if entry]
    if not indices:
        return Check(
            "devices", False, f"--device is empty: a {kind} worker needs its GPU index, e.g. 0"
        )
    if not (dev / "nvidiactl").exists():
        return Check(
            "devices",
            False,
            f"--device {device}: no NVIDIA driver here, {dev / 'nvidiactl'} does not exist (is "
            "the driver loaded, and are the GPUs given to this container or job?)",
        )
    missing = [f"{dev}/nvidia{n}" for n in indices if not (dev / f"nvidia{n}").exists()]
    if missing:
        present = sorted(p.name for p in dev.glob("nvidia[0-9]*"))
        return Check(
            "devices",
            False,
            f"--device {device}: {', '.join(missing)} does not exist (present: "
            f"{', '.join(present) or 'none'}); --device N names /dev/nvidiaN, the driver's "
            "minor number (`nvidia-smi -q | grep Minor`)",
        )
    return Check("devices", True, f"GPU {device}: {', '.join(f'nvidia{n}' for n in indices)}")


def check_forbidden(settings: Settings, given: dict[str, str]) -> list[Check]:
    names = [ENV_PREFIX + field.upper() for field in FORBIDDEN]
    found = []
    for field, why in FORBIDDEN.items():
        if field not in given and getattr(settings, field) is None:
            continue
        where = given.get(field, "the settings")
        found.append(
            Check(
                "no-secrets",
                False,
                f"remove it from the GPU host: {ENV_PREFIX}{field.upper()} is set (in {where}); "
                f"{why}",
            )
        )
    return found or [Check("no-secrets", True, f"none of {', '.join(names)} is set")]


def check_state_dir(settings: Settings, given: dict[str, str]) -> Check:
    path = settings.state_dir.absolute()
    if "state_dir" not in given:
        return Check(
            "state-dir",
            False,
            f"{ENV_PREFIX}STATE_DIR is not set (the default ./var is relative to the working "
            f"dir: {path}): set this host's own state dir, e.g. /var/lib/autopilot",
        )
    if not path.is_dir():
        return Check(
            "state-dir",
            False,
            f"{path} does not exist: create it for the service's user "
            f"(`install -d -o autopilot -g autopilot -m 0750 {path}`)",
        )
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return Check(
            "state-dir",
            False,
            f"{path} is not writable ({exc.strerror}): give it to the user the workers run as",
        )
    free_gib = shutil.disk_usage(path).free / 2**30
    return Check("state-dir", True, f"{path} is writable ({free_gib:.1f} GiB free)")


def check_broker(settings: Settings) -> Check:
    url = settings.broker_url
    shown = redact_url(url)
    if url.startswith(("redis://", "rediss://")):
        import redis

        try:
            client = redis.Redis.from_url(
                url, socket_timeout=BROKER_TIMEOUT_S, socket_connect_timeout=BROKER_TIMEOUT_S
            )
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:  # any client error: the broker is not usable from here
            return Check(
                "broker",
                False,
                f"{shown} gave no PING answer within {BROKER_TIMEOUT_S:g} s ({reason(exc)}): set "
                f"{ENV_PREFIX}BROKER_URL to the control host's Redis (with its password) and "
                "let this host reach its port",
            )
        return Check("broker", True, f"{shown} answers PING")
    if url.startswith("filesystem://"):
        return _check_broker_folder(settings.broker_dir)
    return Check(
        "broker",
        False,
        f"{shown} lives inside one process and reaches no other: set {ENV_PREFIX}BROKER_URL "
        "to the control host's redis://",
    )


def _check_broker_folder(folder: Path) -> Check:
    # The control host's processes make the folders; a GPU host that finds none has its own.
    if not folder.is_dir():
        return Check(
            "broker",
            False,
            f"filesystem broker: {folder} does not exist. It works only on the control host's "
            f"machine, with its state dir; a GPU host elsewhere needs {ENV_PREFIX}BROKER_URL="
            "redis://... (the control host's Redis)",
        )
    folders = [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]
    locked = [str(p) for p in folders if not os.access(p, os.W_OK | os.X_OK)]
    if locked:
        return Check(
            "broker",
            False,
            f"filesystem broker: not writable: {', '.join(locked)}: give them to the user "
            "the workers run as",
        )
    return Check(
        "broker",
        True,
        f"filesystem broker in {folder} is writable (one machine only: a GPU host on another "
        "machine needs redis://)",
    )


def check_ops_db(settings: Settings, given: dict[str, str]) -> Check:
    if "ops_url" not in given:
        return Check(
            "ops-db",
            False,
            f"{ENV_PREFIX}OPS_URL is not set: this host would use a SQLite file of its own "
            f"({redact_url(settings.ops_database_url)}), not the control host's ops DB; set "
            "the control host's URL, e.g. postgresql+psycopg://autopilot:...@control:5432/"
            "autopilot_ops",
        )
    url = settings.ops_database_url
    shown = redact_url(url)
    parsed = make_url(url)
    database = parsed.database or ""
    # Connecting to a SQLite file that is not there would create an empty one.
    is_file = parsed.get_backend_name() == "sqlite" and database not in ("", ":memory:")
    if is_file and not Path(database).is_file():
        return Check(
            "ops-db",
            False,
            f"{shown}: no such file: {ENV_PREFIX}OPS_URL must name the control host's ops DB",
        )
    try:
        schema = migrate.schema_revision("ops", url)
    except Exception as exc:  # any driver error: not reachable from here
        return Check(
            "ops-db",
            False,
            f"{shown} is not reachable ({reason(exc)}): check {ENV_PREFIX}OPS_URL (host, database, "
            "user, password) and that this host may connect to it",
        )
    heads = ", ".join(schema.heads)
    if schema.current is None:
        return Check(
            "ops-db",
            False,
            f"{shown} is reachable but has no tables: run `autopilot db upgrade` on the "
            "control host",
        )
    if not schema.known:
        return Check(
            "ops-db",
            False,
            f"{shown} is at revision {schema.current}, newer than this host's code (head "
            f"{heads}): install the control host's version of autopilot here",
        )
    if not schema.at_head:
        return Check(
            "ops-db",
            False,
            f"{shown} is at revision {schema.current}, this code expects {heads}: run "
            "`autopilot db upgrade` on the control host, with the same version on every host",
        )
    return Check("ops-db", True, f"{shown} is reachable, schema at {schema.current}")


def check_control(settings: Settings, given: dict[str, str]) -> list[Check]:
    """The API's URL (`/healthz`), then the token against the forge and the REST API."""
    token = settings.control_token.get_secret_value() if settings.control_token else ""
    no_token = Check(
        "control-token", False, f"{ENV_PREFIX}CONTROL_TOKEN is not set: {HOW_TO_GET_ONE}"
    )
    if "control_url" not in given:
        url_check = Check(
            "control-url",
            False,
            f"{ENV_PREFIX}CONTROL_URL is not set (the default {settings.control_url} is this "
            "machine): set the API's base URL as this host reaches it, e.g. "
            "http://control.lab:8000",
        )
        return [url_check, no_token if not token else _unchecked()]
    url = settings.control_url
    with httpx.Client(base_url=url, timeout=HTTP_TIMEOUT_S, follow_redirects=False) as client:
        try:
            answer = client.get("/healthz")
        except httpx.HTTPError as exc:
            return [
                Check(
                    "control-url",
                    False,
                    f"{url}/healthz gave no answer ({reason(exc)}): is the API up, and may this "
                    "host reach it?",
                ),
                no_token if not token else _unchecked(),
            ]
        if answer.status_code != 200:
            return [
                Check(
                    "control-url",
                    False,
                    f"{url}/healthz answered {answer.status_code}, not 200: set "
                    f"{ENV_PREFIX}CONTROL_URL to the API's base URL",
                ),
                no_token if not token else _unchecked(),
            ]
        url_check = Check("control-url", True, f"{url}/healthz answers 200")
        if not token:
            return [url_check, no_token]
        return [url_check, check_token(client, url, token)]


def _unchecked() -> Check:
    return Check("control-token", False, "not checked: it needs a reachable control URL (above)")


def check_token(client: httpx.Client, url: str, token: str, *, strict: bool = True) -> Check:
    """The token against the forge and the REST API. With `strict=False` (a worker's start),
    a token with more than scope worker passes with a warning: it works, it is only too
    strong for a host that runs untrusted code."""
    headers = {"Authorization": f"Bearer {token}"}
    probe = f"/git/{PROBE_PROJECT}.git/info/refs"
    rest: httpx.Response | None = None
    try:
        answer = client.get(probe, params={"service": "git-upload-pack"}, headers=headers)
        if answer.status_code in (200, 404):
            # A worker token reads nothing of the REST API; one that does is too strong here.
            rest = client.get("/api/v1/projects", headers=headers)
    except httpx.HTTPError as exc:
        return Check("control-token", False, f"{url}{probe} gave no answer ({reason(exc)})")
    status = answer.status_code
    if status == 401:
        return Check(
            "control-token",
            False,
            f"refused by the API (401: unknown, revoked or expired): {HOW_TO_GET_ONE}",
        )
    if status == 403:
        return Check(
            "control-token",
            False,
            "accepted, but it lacks scope worker (403 from the forge): a GPU host needs a "
            f"token with scope worker; {HOW_TO_GET_ONE}",
        )
    if status not in (200, 404):
        return Check(
            "control-token",
            False,
            f"{url}{probe} answered {status}, expected 404: is {ENV_PREFIX}CONTROL_URL the "
            "API's base URL?",
        )
    if rest is not None and rest.status_code != 403:
        return Check(
            "control-token",
            not strict,
            f"accepted, but it has more than scope worker (it reads /api/v1: "
            f"{rest.status_code}): a GPU host holds a worker-only token; {HOW_TO_GET_ONE}, and "
            "revoke this one",
            warn=not strict,
        )
    return Check(
        "control-token", True, "accepted with scope worker (fetches the forge, nothing else)"
    )


def check_git() -> Check:
    path = shutil.which("git")
    if path is None:
        return Check("git", False, "git is not on PATH: install it (e.g. `apt install git`)")
    version = _git(path, "--version")
    exec_path = Path(_git(path, "--exec-path"))
    if not (exec_path / "git-remote-http").exists():
        return Check(
            "git",
            False,
            f"{version} ({path}) cannot fetch over HTTP: no git-remote-http in {exec_path}; "
            "install a git built with curl (Debian's `git` package is)",
        )
    return Check("git", True, f"{version} ({path})")


def _git(path: str, arg: str) -> str:
    done = subprocess.run(  # noqa: S603 (git found on PATH, fixed arguments)
        [path, arg], capture_output=True, text=True, timeout=10, check=False
    )
    return done.stdout.strip()


def check_runtime(settings: Settings) -> Check:
    """The launcher's runtime dir choice, as `autopilot doctor runtime` shows it in full."""
    try:
        chosen = runtime.allocate_runtime(state_dir=settings.state_dir, env=os.environ)
    except runtime.RuntimeDirError as exc:
        first = str(exc).splitlines()[0]
        return Check("runtime-dir", False, f"{first}: see `autopilot doctor runtime`")
    try:
        runtime.probe_bind(chosen)
        root = os.path.dirname(str(chosen.target))
    except OSError as exc:
        return Check("runtime-dir", False, f"a socket bind failed ({reason(exc)})")
    finally:
        runtime.release_runtime(chosen)
    return Check(
        "runtime-dir",
        True,
        f"jobs get their runtime dirs under {root} (a socket bind there works; details: "
        "`autopilot doctor runtime`)",
    )


def check_sandbox(settings: Settings) -> Check:
    """Whether experiments run confined here (a GPU worker refuses to start when they cannot)."""
    if settings.sandbox == "off":
        return Check(
            "sandbox",
            True,
            "off (AUTOPILOT_SANDBOX=off): experiments run unconfined, and every job records it",
        )
    if missing := confined.check():
        return Check(
            "sandbox",
            False,
            f"{missing}; a GPU worker will not start (AUTOPILOT_SANDBOX=off runs experiments "
            "unconfined)",
        )
    return Check(
        "sandbox", True, "bubblewrap and cgroup v2 work: experiments run confined, one cgroup each"
    )


def check_kind(settings: Settings, kind: str) -> Check:
    if kind not in settings.gpu_kinds:
        return Check(
            "gpu-kind",
            False,
            f"{kind!r} is not a configured GPU kind ({', '.join(settings.gpu_kinds)}): use one "
            f"of them, or the control host's {ENV_PREFIX}GPU_KINDS here too",
        )
    return Check("gpu-kind", True, f"{kind}: the workers consume queue gpu.{kind}")


def reason(exc: BaseException) -> str:
    """An exception's class and first line, short enough for one line of output."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
