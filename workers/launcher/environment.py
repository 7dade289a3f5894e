"""The experiment's environment: an allow-list of the worker's variables plus the protocol.

The worker holds the service's secrets (forge tokens, database URLs); the experiment is
untrusted research code and gets none of them, nor any variable that injects code into an
interpreter, a loader or a shell.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Taken from the worker's environment as they are: what a Python program and its libraries
#: need to find programs (PATH), a home for caches (HOME), the user's name, locale and
#: terminal, and the time zone. Nothing else passes through.
ALLOWED_FROM_WORKER = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TZ"}
)
ALLOWED_PREFIXES = ("LC_",)

#: Set by the launcher itself; a job's extra variables may not override them.
PROTOCOL = frozenset(
    {
        "PYTHONSAFEPATH",
        "PYTHONPATH",
        "PYTHONNOUSERSITE",
        "PYTHONPYCACHEPREFIX",
        "PYTHONDONTWRITEBYTECODE",
        "TMPDIR",
        "CUDA_VISIBLE_DEVICES",
        "AUTOPILOT_SPEC",
        "AUTOPILOT_EVENTS",
        "AUTOPILOT_RESULT",
        "AUTOPILOT_REQUIREMENTS_HASH",
    }
)

#: Never given to a job: code injection into the loader, interpreters and shells, and the
#: git/ssh hooks that run a command.
DENIED = frozenset(
    {
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_DEBUG_OUTPUT",
        "LD_PROFILE",
        "LD_ORIGIN_PATH",
        "DYLD_INSERT_LIBRARIES",
        "DYLD_LIBRARY_PATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONINSPECT",
        "PYTHONEXECUTABLE",
        "PYTHONUSERBASE",
        "PYTHONPLATLIBDIR",
        "PYTHONBREAKPOINT",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "PROMPT_COMMAND",
        "IFS",
        "CDPATH",
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "GIT_EXEC_PATH",
        "GIT_CONFIG_GLOBAL",
        "GIT_CONFIG_SYSTEM",
        "GIT_CONFIG_PARAMETERS",
        "GIT_PROXY_COMMAND",
        "GIT_EXTERNAL_DIFF",
        "GIT_PAGER",
        "PAGER",
        "EDITOR",
        "VISUAL",
        "SSH_AUTH_SOCK",
        "PERL5OPT",
        "PERL5LIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "JAVA_TOOL_OPTIONS",
        "DATABASE_URL",
    }
)
#: Names that carry secrets by convention, wherever they appear in the name.
_SECRET_NAME = re.compile(
    r"(TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL|PRIVATE_KEY|API_KEY|ACCESS_KEY|_DSN$|"
    r"DATABASE_URL|_DB_URL$|^AUTOPILOT_|^GIT_CONFIG_)"
)
_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# scheme://user:password@host: a URL that carries a password is a secret whatever its name.
_URL_WITH_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*:[^/@\s]+@")


class EnvError(ValueError):
    """A job asked for an environment variable it may not have."""


def is_denied(name: str) -> bool:
    return name in DENIED or bool(_SECRET_NAME.search(name))


def validate_extra(extra: Mapping[str, str]) -> dict[str, str]:
    """Check a job's own variables: a plain name, not a secret or injection, not the protocol.

    `LD_LIBRARY_PATH` is allowed here (CUDA builds need it) though never inherited.
    """
    checked: dict[str, str] = {}
    for name, value in extra.items():
        if not _NAME.match(name):
            raise EnvError(f"variable name {name!r} is not of the form [A-Z_][A-Z0-9_]*")
        if name in PROTOCOL:
            raise EnvError(f"{name} is set by the launcher; a job cannot override it")
        if is_denied(name):
            raise EnvError(
                f"{name} is not given to experiments (secret or code-injection variable); "
                "pass the value through the experiment spec if the job truly needs it"
            )
        if not isinstance(value, str) or "\0" in value:
            raise EnvError(f"value of {name} must be a string without NUL bytes")
        if _URL_WITH_PASSWORD.match(value):
            raise EnvError(f"value of {name} is a URL with a password; experiments get no secrets")
        checked[name] = value
    return checked


def build_child_env(
    *,
    base_env: Mapping[str, str],
    venv: Path,
    runtime_dir: Path,
    events_path: Path,
    result_path: Path,
    spec_path: Path,
    cuda_visible_devices: str | None,
    pythonpath: Sequence[Path] = (),
    requirements_hash: str | None = None,
    extra: Mapping[str, str] | None = None,
    safe_path: bool = True,
) -> dict[str, str]:
    """The complete environment of an experiment process (and of its preflight guard).

    No bytecode is written (`PYTHONDONTWRITEBYTECODE`): the job's tree is a per-job export
    with no bytecode in it (`forge.mirror.export` leaves it out, and an agent may not commit
    any), so the job imports the tree's sources, never a `.pyc` another run left beside them.
    There is deliberately no per-job `PYTHONPYCACHEPREFIX`: an empty prefix hides the stdlib's
    and the venv's caches too and made every job compile all it imports (`import torch` 2.1 s
    -> 5.4 s, docs/benchmarks.md); the venv is read-only in the sandbox, so its caches cannot
    be planted by a job.

    A command experiment's script (`safe_path=False`) runs as it would from a shell: its own
    folder first on sys.path, so it imports the modules beside it."""
    env = {
        name: value
        for name, value in base_env.items()
        if (name in ALLOWED_FROM_WORKER or name.startswith(ALLOWED_PREFIXES))
        and not is_denied(name)
    }
    # The venv's bin first, as `activate` does: a job that runs `python` or a console script
    # in a subprocess gets the venv's, not the worker's.
    venv_bin = os.path.join(os.path.abspath(venv), "bin")
    env["PATH"] = os.pathsep.join(p for p in (venv_bin, env.get("PATH", os.defpath)) if p)
    env.update(validate_extra(extra or {}))
    if safe_path:  # a module in cwd cannot shadow the entry or its imports
        env["PYTHONSAFEPATH"] = "1"
    env["PYTHONNOUSERSITE"] = "1"  # ~/.local is outside the venv: never on the job's path
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in pythonpath)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["TMPDIR"] = str(runtime_dir)
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    env["AUTOPILOT_SPEC"] = str(spec_path)
    env["AUTOPILOT_EVENTS"] = str(events_path)
    env["AUTOPILOT_RESULT"] = str(result_path)
    if requirements_hash is not None:
        env["AUTOPILOT_REQUIREMENTS_HASH"] = requirements_hash
    return env
