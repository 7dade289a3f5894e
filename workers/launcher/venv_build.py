"""How a project venv is built: uv (`uv venv` + `uv pip install`, then `uv pip freeze` for its
lock), or pip for the one case uv must not handle (a venv that needs torch and does not inherit
the host's), each step logged, summarised as it goes, and sandboxed when asked.

torch is never resolved by uv (`--excludes`): uv reads none of pip's configuration, so it does
not see the torch wheel a host keeps locally (nor pip's constraints), and an unpinned torch
would make it download a multi-GB CUDA build. A venv that inherits the host's packages
(`system_site_packages`) gets the host's torch that way; one that does not and names torch (or a
package built against it) is built by pip, which honours the host's pip configuration.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from uv import find_uv_bin

from app.sandbox import bwrap, cgroups

REQUIREMENTS_FILE = "autopilot-requirements.txt"
EXCLUDES_FILE = "autopilot-excludes.txt"
#: Shared by the builds under one state dir: downloads and built wheels only, no secrets.
PIP_CACHE_DIR = ".pip-cache"
UV_CACHE_DIR = ".uv-cache"
#: Never resolved by uv (see the module's docstring).
UV_EXCLUDED = ("torch",)
#: Requirements that need torch: a venv that does not inherit the host's torch and names one of
#: these is built by pip.
TORCH_FAMILY = frozenset({"torch", "torchvision", "torchaudio"})
#: What a local source folder's build leaves in it: never copied, never part of its hash.
SOURCE_IGNORED = ("build", "*.egg-info", "__pycache__")

#: The only variables of the worker's environment a venv build's subprocesses (uv, `python -m
#: venv`, pip, and the package builds they run, i.e. any setup.py of any requirement) get: the
#: worker holds tokens and database URLs with passwords that none of them needs. HOME is set
#: apart, to a private folder of the build; what pip or uv needs from the operator (a mirror,
#: its certificates, a proxy) is here, by name. A pattern may end in '*'.
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
    # uv reads none of pip's settings: a mirror for uv builds is set with uv's own.
    "UV_DEFAULT_INDEX",
    "UV_INDEX",
    "UV_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_NO_INDEX",
    "UV_INSECURE_HOST",
    "UV_NATIVE_TLS",
    "UV_HTTP_TIMEOUT",
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
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")

#: Called with (phase, line) while a venv builds: phases are "lock", "create", "install",
#: "check", "freeze", "done"; `line` is one line of the tool's output or a short status.
Progress = Callable[[str, str], None]


class VenvError(Exception):
    """A venv is missing, not a venv, or could not be built; the message says what to do."""


@dataclass(frozen=True)
class Built:
    """What a build made, for the venv's completion marker."""

    installer: str  # "uv" or "pip"
    inherited_site_dirs: list[str]
    lock: list[str]  # `uv pip freeze` of the venv's own packages


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
    this is the second line of defence, on the very lines pip or uv will read: no pip option
    (`--index-url`, `-r`, `-e`, `pkg --config-settings=...`, `--hash` too), no `${VAR}` that the
    installer would expand from its environment, no line break or trailing backslash that would
    make one line two or join two. A local folder (the harness, an absolute path) passes here.
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
                "declared through PIP_INDEX_URL / UV_DEFAULT_INDEX in the worker's environment"
            )


def installer_for(requirements: Sequence[str], system_site_packages: bool) -> str:
    """ "uv", except for a venv that does not inherit the host's packages and names torch or a
    package of its family: uv never resolves torch, so that one is built by pip."""
    if system_site_packages:
        return "uv"
    names = {m.group(1).lower().replace("_", "-") for r in requirements if (m := _NAME.match(r))}
    return "pip" if names & TORCH_FAMILY else "uv"


def cache_scope(target: Path) -> str:
    """Whose caches a venv's build uses: the project's, from the venv's folder name
    (`<project>-<key>-py<version>`, `venv.venv_dir`)."""
    return target.name.rsplit("-", 2)[0] or target.name


def build(
    target: Path,
    requirements: Sequence[str],
    *,
    system_site_packages: bool,
    base_python: str,
    log_path: Path,
    report: Progress,
    install_timeout_s: float,
    sandboxed: bool,
    installer: str | None = None,
) -> Built:
    """Build the venv at `target` (which must not exist) in a private home; what it made.
    `installer` ("uv" or "pip") overrides `installer_for`'s choice (bench/venv_build.py)."""
    wanted = [r.strip() for r in requirements if r.strip() and not r.strip().startswith("#")]
    refuse_pip_options(wanted)  # before anything is built: these are the lines installed
    installer = installer or installer_for(wanted, system_site_packages)
    home = target.parent / f"{target.name}.home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(mode=0o700)
    # One cache per project: a build runs the project's own package builds, which can write
    # into the cache it is given; a shared one would let one project's sdist plant files that
    # another project's venv copies in.
    project = cache_scope(target)
    caches = [target.parent / PIP_CACHE_DIR / project, target.parent / UV_CACHE_DIR / project]
    for cache in caches:
        cache.mkdir(parents=True, exist_ok=True)
    target.mkdir()
    uv = find_uv_bin()
    env = build_env(home) | {
        "PIP_CACHE_DIR": str(caches[0]),
        "UV_CACHE_DIR": str(caches[1]),
        "UV_PYTHON_DOWNLOADS": "never",  # the base interpreter is given: never fetch one
    }
    confine = (
        bwrap.Policy(
            cwd=home,
            env=env,
            writable=[target, home, *caches],
            read_only=[*_interpreter_paths(base_python), Path(uv)],
            network=True,  # the package index
        )
        if sandboxed
        else None
    )
    steps = _Steps(uv, env, confine, report, install_timeout_s)
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            steps.log = log
            return _create_and_install(
                steps, installer, target, wanted, system_site_packages, base_python
            )
    finally:
        shutil.rmtree(home, ignore_errors=True)


@dataclass
class _Steps:
    """Runs a build's commands, each logged, reported and (with `confine`) sandboxed."""

    uv: str
    env: dict[str, str]
    confine: bwrap.Policy | None
    report: Progress
    install_timeout_s: float
    log: TextIO | None = None

    def run(self, phase: str, argv: list[str], timeout_s: float = 600.0) -> list[str]:
        assert self.log is not None
        return _run_logged(argv, self.log, self.report, phase, timeout_s, self.env, self.confine)


def _create_and_install(
    steps: _Steps,
    installer: str,
    target: Path,
    wanted: list[str],
    system_site_packages: bool,
    base_python: str,
) -> Built:
    uv_python = ["--python", str(target / "bin" / "python"), "--no-config"]
    if installer == "uv":
        create = [steps.uv, "venv", "--no-config", "--python", base_python]
    else:
        create = [base_python, "-m", "venv"]  # pip builds only a venv with requirements
    if system_site_packages:
        create.append("--system-site-packages")
    steps.run("create", [*create, str(target)])
    inherited = _inherit_parent_venv(target, base_python, steps.env) if system_site_packages else []
    if wanted:
        req_file = target / REQUIREMENTS_FILE
        req_file.write_text("\n".join(_private_sources(wanted, target / "src")) + "\n")
        if installer == "uv":
            excludes = target / EXCLUDES_FILE
            excludes.write_text("\n".join(UV_EXCLUDED) + "\n")
            # Copies, not hardlinks into the shared cache: nothing a job writes into its venv
            # reaches the cache or another venv.
            install = [steps.uv, "pip", "install", *uv_python, "--link-mode", "copy"]
            install += ["--excludes", str(excludes), "-r", str(req_file)]
        else:
            install = [str(target / "bin" / "python"), "-m", "pip", "install"]
            install += ["--disable-pip-version-check", "-r", str(req_file)]
        steps.run("install", install, steps.install_timeout_s)
        if installer == "uv" and not system_site_packages:
            # A requirement that needs torch without naming it would otherwise run without it.
            steps.run("check", [steps.uv, "pip", "check", *uv_python])
    lock = steps.run("freeze", [steps.uv, "pip", "freeze", "--quiet", *uv_python])
    return Built(installer, inherited, [line for line in lock if line and line[0].isalnum()])


def _private_sources(requirements: Sequence[str], into: Path) -> list[str]:
    """Requirements that name a local source folder (the harness) are installed from a private
    copy: a setuptools build writes `build/` and `*.egg-info` into the folder it builds, and
    two venvs built at once from one folder (two projects, two GPU workers of a host) corrupt
    each other's build."""
    out: list[str] = []
    for line in requirements:
        folder = Path(line)
        if folder.is_absolute() and folder.is_dir():
            copy = into / f"{len(out)}-{folder.name}"
            shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(*SOURCE_IGNORED))
            line = str(copy)
        out.append(line)
    return out


#: Written into a venv built with system site packages over a base that is itself a venv.
PARENT_VENV_PTH = "_autopilot_parent_venv.pth"


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
    confine: bwrap.Policy | None = None,
) -> list[str]:
    """Run one step, its output into the log and `report` line by line; its output lines."""
    log.write(f"$ {' '.join(argv)}\n")
    report(phase, " ".join(argv))
    with contextlib.ExitStack() as stack:
        cgroup = (
            stack.enter_context(
                cgroups.Cgroup.create(f"venv-{os.getpid()}-{threading.get_ident()}-{phase}")
            )
            if confine is not None
            else None
        )
        return _run_pumped(
            bwrap.command(argv, confine) if confine is not None else argv,
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
    cgroup: cgroups.Cgroup | None,
    log: TextIO,
    report: Progress,
    phase: str,
    timeout_s: float,
    shown: str,
) -> list[str]:
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
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            report(phase, line.rstrip("\n"))
            lines.append(line.rstrip("\n"))

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
            + "\n".join(lines[-10:])
            + f"\nfull log: {log.name}"
        )
    return lines
