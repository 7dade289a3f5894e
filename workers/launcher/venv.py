"""Project virtualenvs: built once per (project, requirements hash, Python), reused after.

Venvs are not relocatable, so each one is built in its final place under `<state>/venvs/`,
behind a file lock, and only counts as built once its completion marker exists.
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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from app import sandbox

COMPLETE_MARKER = ".autopilot-complete"
REQUIREMENTS_FILE = "autopilot-requirements.txt"
BUILD_LOG = "autopilot-build.log"
_PROJECT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: Shared by the builds under one state dir: downloads and built wheels only, no secrets.
PIP_CACHE_DIR = ".pip-cache"

#: The only variables of the worker's environment a venv build's subprocesses (`python -m venv`,
#: pip, and the package builds pip runs, i.e. any setup.py of any requirement) get: the worker
#: holds tokens and database URLs with passwords that none of them needs. HOME is set apart,
#: to a private folder of the build; what pip needs from the operator (a mirror, its
#: certificates, a proxy) is here, by name. A pattern may end in '*'.
BUILD_ENV_ALLOWED: tuple[str, ...] = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
    "PIP_CERT",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)
# A pip option, at a line's start or after whitespace (`pkg --config-settings=...`).
_PIP_OPTION = re.compile(r"(?:^|\s)-")

#: Called with (phase, line) while a venv builds: phases are "lock", "create", "install",
#: "done"; `line` is one line of the tool's output or a short status.
Progress = Callable[[str, str], None]


class VenvError(Exception):
    """A venv is missing, not a venv, or could not be built; the message says what to do."""


@dataclass(frozen=True)
class Venv:
    path: Path
    python: Path
    requirements_hash: str
    python_version: str
    built: bool  # True when this call built it, False when an existing one was reused
    log_path: Path


def requirements_hash(requirements: Sequence[str]) -> str:
    """Hash of the requirement lines, ignoring blank lines, comments and order."""
    lines = sorted(
        {line.strip() for line in requirements if line.strip() and not line.strip().startswith("#")}
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def interpreter_path(venv: str | os.PathLike[str]) -> Path:
    """The absolute, never resolved `<venv>/bin/python` (DESIGN.md, Lesson 1).

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


def build_env(
    home: str | os.PathLike[str], base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a venv build's subprocesses: `BUILD_ENV_ALLOWED` out of `base` (the
    worker's environment), HOME set to `home`."""
    source = os.environ if base is None else base
    env = {
        name: value
        for name, value in source.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in BUILD_ENV_ALLOWED)
    }
    env["HOME"] = os.fspath(home)
    return env


def refuse_pip_options(requirements: Sequence[str]) -> None:
    """VenvError naming the first line that is not a plain requirement for a requirements file.

    `autopilot.toml` is checked when it is parsed (app.projects.config.check_requirement);
    this is the second line of defence, on the very lines pip will read: no pip option
    (`--index-url`, `-r`, `-e`, `pkg --config-settings=...`, `--hash` too), no `${VAR}` that pip
    would expand from its environment, no line break or trailing backslash that would make
    one line two or join two. A local folder (the harness, an absolute path) passes here.
    """
    for line in requirements:
        if (
            _PIP_OPTION.search(line)
            or "${" in line
            or any(ch in line for ch in "\r\n\0")
            or line.rstrip().endswith("\\")
        ):
            raise VenvError(
                f"requirement line {line!r} is or carries a pip option (or a ${{VAR}}, or a "
                "line break): only requirements are installed; a package index or mirror is "
                "declared through PIP_INDEX_URL in the worker's environment"
            )


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

    With `sandboxed`, `python -m venv` and pip (and every package build it runs: a setup.py is
    code from the registry) run under bubblewrap in a cgroup of their own, seeing only the venv
    being built, the build's home, pip's cache and the interpreter (`app.sandbox`).

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
            return Venv(target, interpreter_path(target), req_hash, version, False, log_path)
        if target.exists():
            report("create", f"removing half-built {target}")
            shutil.rmtree(target)
        inherited = _build(
            target,
            requirements,
            system_site_packages,
            base_python,
            log_path,
            report,
            install_timeout_s,
            sandboxed,
        )
        marker = {
            "requirements_hash": req_hash,
            "python": version,
            "system_site_packages": system_site_packages,
            # Read by the sandbox (what it binds), never from the venv's own .pth or
            # pyvenv.cfg: a requirement's build could rewrite those.
            "inherited_site_dirs": inherited,
            "built_at": time.time(),
        }
        tmp = target / f"{COMPLETE_MARKER}.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # never written through a link the build left there
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(marker))
        os.replace(tmp, target / COMPLETE_MARKER)  # written last: only now is the venv usable
        report("done", f"built {target}")
        return Venv(target, interpreter_path(target), req_hash, version, True, log_path)


def _build(
    target: Path,
    requirements: Sequence[str],
    system_site_packages: bool,
    base_python: str,
    log_path: Path,
    report: Progress,
    install_timeout_s: float,
    sandboxed: bool,
) -> list[str]:
    wanted = [r.strip() for r in requirements if r.strip() and not r.strip().startswith("#")]
    refuse_pip_options(wanted)  # before anything is built: these are the lines pip will read
    home = target.parent / f"{target.name}.home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(mode=0o700)
    cache = target.parent / PIP_CACHE_DIR
    cache.mkdir(exist_ok=True)
    target.mkdir()
    env = build_env(home) | {"PIP_CACHE_DIR": str(cache)}
    confine = (
        sandbox.Policy(
            cwd=home,
            env=env,
            writable=[target, home, cache],
            read_only=_interpreter_paths(base_python),
            network=True,  # pip reaches the package index
        )
        if sandboxed
        else None
    )
    try:
        return _create_and_install(
            target,
            wanted,
            system_site_packages,
            base_python,
            log_path,
            report,
            install_timeout_s,
            env,
            confine,
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _create_and_install(
    target: Path,
    wanted: list[str],
    system_site_packages: bool,
    base_python: str,
    log_path: Path,
    report: Progress,
    install_timeout_s: float,
    env: dict[str, str],
    confine: sandbox.Policy | None,
) -> list[str]:
    create = [base_python, "-m", "venv"]
    if system_site_packages:
        create.append("--system-site-packages")
    if not wanted:
        create.append("--without-pip")  # nothing to install: skip the slow ensurepip step
    create.append(str(target))
    with open(log_path, "w", encoding="utf-8") as log:
        _run_logged(create, log, report, "create", 600.0, env, confine)
        inherited = _inherit_parent_venv(target, base_python, env) if system_site_packages else []
        if not wanted:
            return inherited
        req_file = target / REQUIREMENTS_FILE
        req_file.write_text("\n".join(_private_sources(wanted, target / "src")) + "\n")
        install = [
            str(target / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-r",
            str(req_file),
        ]
        _run_logged(install, log, report, "install", install_timeout_s, env, confine)
    return inherited


def _private_sources(requirements: Sequence[str], into: Path) -> list[str]:
    """Requirements that name a local source folder (the harness) are installed from a private
    copy: pip's setuptools build writes `build/` and `*.egg-info` into the folder it builds, and
    two venvs built at once from one folder (two projects, two GPU workers of a host) corrupt
    each other's build."""
    out: list[str] = []
    for line in requirements:
        folder = Path(line)
        if folder.is_absolute() and folder.is_dir():
            copy = into / f"{len(out)}-{folder.name}"
            shutil.copytree(
                folder, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
            )
            line = str(copy)
        out.append(line)
    return out


#: Written into a venv built with system site packages over a base that is itself a venv.
PARENT_VENV_PTH = "_autopilot_parent_venv.pth"


def inherited_site_dirs(venv: Path) -> list[str]:
    """The parent venv's site-packages a venv reaches through `PARENT_VENV_PTH` (its system
    site packages, in effect), or none: as the build recorded them in its completion marker,
    from the trusted base interpreter (a requirement's build could rewrite the venv's .pth).
    A venv built before the marker held them is read the old way."""
    try:
        fd = os.open(
            Path(os.path.abspath(venv)) / COMPLETE_MARKER,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
        )
        with os.fdopen(fd) as handle:
            recorded = json.loads(handle.read(1 << 20)).get("inherited_site_dirs")
        if isinstance(recorded, list):
            return [d for d in recorded if isinstance(d, str) and d.startswith("/")]
    except (OSError, ValueError, AttributeError):
        pass
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


def _inherit_parent_venv(target: Path, base_python: str, env: dict[str, str]) -> list[str]:
    """`--system-site-packages` exposes the *base* interpreter's packages. When the base is
    itself a venv (the service's, holding torch), a .pth file adds that venv's site-packages
    too, after the new venv's own, so "reuse the installed torch" means what it says."""
    probe = subprocess.run(  # noqa: S603 - the configured base interpreter, fixed argv
        [
            base_python,
            "-c",
            "import site, sys; print(sys.prefix != sys.base_prefix); "
            "print('\\n'.join(site.getsitepackages()))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    first, *paths = probe.stdout.splitlines()
    if first != "True" or not paths:
        return []
    for site_dir in (target / "lib").glob("python*/site-packages"):
        (site_dir / PARENT_VENV_PTH).write_text("\n".join(paths) + "\n")
    return paths


def _interpreter_paths(base_python: str) -> list[Path]:
    """What a sandboxed build must read of the base interpreter: the venv it lives in when it
    is one (the service's, say) and that venv's own base (in the system paths)."""
    prefix = Path(os.path.abspath(base_python)).parent.parent
    return [prefix] if (prefix / "pyvenv.cfg").is_file() else []


def _run_logged(
    argv: list[str],
    log: TextIO,
    report: Progress,
    phase: str,
    timeout_s: float,
    env: dict[str, str],
    confine: sandbox.Policy | None = None,
) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    report(phase, " ".join(argv))
    with contextlib.ExitStack() as stack:
        cgroup = (
            stack.enter_context(
                sandbox.Cgroup.create(f"venv-{os.getpid()}-{threading.get_ident()}-{phase}")
            )
            if confine is not None
            else None
        )
        _run_pumped(
            sandbox.command(argv, confine) if confine is not None else argv,
            {} if confine is not None else env,
            cgroup,
            log,
            report,
            phase,
            timeout_s,
            " ".join(argv),
        )


def _run_pumped(
    args: list[str],
    env: dict[str, str],
    cgroup: sandbox.Cgroup | None,
    log: TextIO,
    report: Progress,
    phase: str,
    timeout_s: float,
    shown: str,
) -> None:
    proc = subprocess.Popen(  # noqa: S603 - argv built here, never a shell
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=env,
        preexec_fn=cgroup.preexec() if cgroup is not None else None,  # noqa: PLW1509
    )
    tail: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            report(phase, line.rstrip("\n"))
            tail.append(line.rstrip("\n"))
            del tail[:-10]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise VenvError(
            f"venv {phase} step ran past {timeout_s:.0f} s and was killed: {shown}; see {log.name}"
        ) from None
    reader.join(timeout=10)
    if code != 0:
        raise VenvError(
            f"venv {phase} step failed (exit {code}): {shown}\n"
            + "\n".join(tail)
            + f"\nfull log: {log.name}"
        )
