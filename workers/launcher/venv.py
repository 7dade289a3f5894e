"""Project virtualenvs: built once per (project, requirements and their content, Python),
reused after; how one is built is `venv_build`'s.

Venvs are not relocatable, so each one is built in its final place under `<state>/venvs/`,
behind a file lock, and only counts as built once its completion marker exists. The marker
records how it was built and its lock (`uv pip freeze`), which a job's environment record
carries.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.launcher.venv_build import (
    PARENT_VENV_PTH,
    SOURCE_IGNORED,
    Progress,
    VenvError,
    build,
    build_env,
)

COMPLETE_MARKER = ".autopilot-complete"
_PROJECT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Venv:
    path: Path
    python: Path
    requirements_hash: str
    python_version: str
    built: bool  # True when this call built it, False when an existing one was reused
    log_path: Path
    #: How it was built, as its completion marker records it (installer, lock, build time).
    marker: dict[str, Any] = field(default_factory=dict, compare=False)

    def environment(self) -> dict[str, Any]:
        """The job's environment record: which venv, how it was built, and its lock."""
        return {
            "venv": str(self.path),
            "key": self.requirements_hash,
            "python": self.python_version,
            "built_now": self.built,
            "installer": self.marker.get("installer"),
            "inherits_host_packages": self.marker.get("system_site_packages"),
            "build_s": self.marker.get("build_s"),
            "lock": self.marker.get("lock"),
        }


def requirements_hash(requirements: Sequence[str]) -> str:
    """The venv's key: a hash of the requirement lines, ignoring blank lines, comments and
    order, where a local source folder (the harness) counts by its content, not its path: a
    change to the harness makes new venvs, a move of the checkout does not."""
    lines = sorted(
        {
            _content_line(line.strip())
            for line in requirements
            if line.strip() and not line.strip().startswith("#")
        }
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _content_line(line: str) -> str:
    folder = Path(line)
    if not (folder.is_absolute() and folder.is_dir()):
        return line
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not _ignored(d))
        for name in sorted(f for f in files if not _ignored(f)):
            path = Path(root, name)
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return f"local folder sha256:{digest.hexdigest()}"


def _ignored(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SOURCE_IGNORED)


def interpreter_path(venv: str | os.PathLike[str]) -> Path:
    """The absolute, never resolved `<venv>/bin/python` (docs/design.md, "Launch through the
    venv's own python").

    Resolving it (realpath, Path.resolve) yields the base interpreter, which finds no
    `pyvenv.cfg` and silently runs without the venv's packages.
    """
    root = os.path.abspath(os.fspath(venv))
    if not os.path.isdir(root):
        raise VenvError(f"venv {root} does not exist; build it with the launcher first")
    if not os.path.isfile(os.path.join(root, "pyvenv.cfg")):
        raise VenvError(
            f"{root} is not a venv (no pyvenv.cfg); create it with `python -m venv {root}`"
        )
    python = os.path.join(root, "bin", "python")
    if not os.path.exists(python):
        raise VenvError(f"venv {root} has no bin/python; rebuild it (delete it and launch again)")
    return Path(python)


def venv_dir(state_dir: Path, project: str, req_hash: str, python_version: str) -> Path:
    if not _PROJECT_NAME.match(project):
        raise VenvError(
            f"project name {project!r} cannot name a venv: use letters, digits, '.', '_', '-'"
        )
    name = f"{project}-{req_hash[:12]}-py{python_version}"
    return Path(os.path.abspath(state_dir)) / "venvs" / name


def _python_version(base_python: str) -> str:
    if os.path.abspath(base_python) == os.path.abspath(sys.executable):
        return f"{sys.version_info.major}.{sys.version_info.minor}"
    out = subprocess.run(  # noqa: S603 - the configured base interpreter, fixed argv
        [base_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=build_env(os.devnull),  # a probe that writes nothing needs no home
    )
    if out.returncode != 0:
        raise VenvError(f"base interpreter {base_python} does not run: {out.stderr.strip()}")
    return out.stdout.strip()


def ensure_venv(
    state_dir: Path,
    project: str,
    requirements: Sequence[str],
    *,
    system_site_packages: bool = False,
    base_python: str = sys.executable,
    progress: Progress | None = None,
    install_timeout_s: float = 3600.0,
    sandboxed: bool = False,
) -> Venv:
    """Return the project's venv for these requirements, building it first if needed.

    With `sandboxed`, uv (or `python -m venv` and pip), and every package build it runs (a
    setup.py is code from the registry), run under bubblewrap in a cgroup of their own, seeing
    only the venv being built, the build's home, the installers' caches, the interpreter and
    the uv binary (`app/sandbox/`).

    Two workers asking for the same venv serialise on a lock file; the second one finds
    the completion marker and reuses the venv. A directory without the marker is a build
    that died half-way: it is removed and built again.
    """
    report = progress or (lambda _phase, _line: None)
    req_hash = requirements_hash(requirements)
    version = _python_version(base_python)
    target = venv_dir(state_dir, project, req_hash, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    log_path = target.parent / f"{target.name}.log"
    lock_path = target.parent / f"{target.name}.lock"
    with open(lock_path, "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report("lock", f"waiting for another build of {target.name}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / COMPLETE_MARKER).is_file():
            report("done", f"reusing {target}")
            return Venv(
                target,
                interpreter_path(target),
                req_hash,
                version,
                False,
                log_path,
                _marker(target),
            )
        if target.exists():
            report("create", f"removing half-built {target}")
            shutil.rmtree(target)
        started = time.monotonic()
        made = build(
            target,
            requirements,
            system_site_packages=system_site_packages,
            base_python=base_python,
            log_path=log_path,
            report=report,
            install_timeout_s=install_timeout_s,
            sandboxed=sandboxed,
        )
        marker = {
            "requirements_hash": req_hash,
            "python": version,
            "system_site_packages": system_site_packages,
            # Read by the sandbox (what it binds), never from the venv's own .pth or
            # pyvenv.cfg: a requirement's build could rewrite those.
            "inherited_site_dirs": made.inherited_site_dirs,
            "installer": made.installer,
            "lock": made.lock,
            "build_s": round(time.monotonic() - started, 3),
            "built_at": time.time(),
        }
        _write_marker(target, marker)
        report("done", f"built {target}")
        return Venv(target, interpreter_path(target), req_hash, version, True, log_path, marker)


def _write_marker(target: Path, marker: dict[str, Any]) -> None:
    tmp = target / f"{COMPLETE_MARKER}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # never written through a link the build left there
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(marker))
    os.replace(tmp, target / COMPLETE_MARKER)  # written last: only now is the venv usable


def _marker(venv: Path) -> dict[str, Any]:
    """The venv's completion marker, or {} when it is missing or unreadable (never followed
    through a link: the build could have left one)."""
    try:
        fd = os.open(
            Path(os.path.abspath(venv)) / COMPLETE_MARKER,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
        )
        with os.fdopen(fd) as handle:
            marker = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def inherited_site_dirs(venv: Path) -> list[str]:
    """The parent venv's site-packages a venv reaches through `PARENT_VENV_PTH` (its system
    site packages, in effect), or none: as the build recorded them in its completion marker,
    from the trusted base interpreter (a requirement's build could rewrite the venv's .pth).
    A venv built before the marker held them is read the old way."""
    recorded = _marker(venv).get("inherited_site_dirs")
    if isinstance(recorded, list):
        return [d for d in recorded if isinstance(d, str) and d.startswith("/")]
    dirs: list[str] = []
    try:
        cfg = (Path(os.path.abspath(venv)) / "pyvenv.cfg").read_text()
    except OSError:
        return dirs
    settings = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition("=") for line in cfg.splitlines())
    )
    if settings.get("include-system-site-packages") != "true":
        return dirs  # the link means something only in a venv that includes system site
    lib = Path(os.path.abspath(venv)) / "lib"
    for pth in lib.glob(f"python*/site-packages/{PARENT_VENV_PTH}"):
        dirs += [line for line in pth.read_text().splitlines() if line.startswith("/")]
    return dirs
