"""The hold-out evaluator of a command experiment on its GPU host (docs/design.md, "Where a number
comes from"): a program of the base commit, run after each recorded run from a tree of its own
(the only export that keeps the project's `hidden_paths`), in a sandbox of its own, reading a
copy of the run's declared `artifacts`, read-only. Its output gives the run's metric
(`metric_source = "evaluator"`) or its check value (`evaluator_check_pattern`).

Also what the runner does with a run's files from outside its sandbox: gives each run a fresh
copy of its arm's export (`fresh_tree`, removed after it: `remove_tree`), clears its files before
the run and copies them after it, one name at a time and never through a link the run could have
planted.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.jobs import paths
from app.projects import command as command_kind
from app.projects.config import Experiment
from app.sandbox import bwrap, confined
from app.sandbox.exceptions import SandboxTimeout
from app.settings import Settings
from workers.launcher import confine
from workers.launcher.venv import inherited_site_dirs

#: The largest artifact the evaluator is given.
MAX_ARTIFACT = 1 << 30
#: How much of a failing evaluator's output its error shows.
TAIL_LINES = 12
#: What the evaluator's environment holds beyond PATH: built here, never the worker's own, so
#: no secret of the worker reaches it.
_ENV = {"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}

#: coreutils' cp (by full path: a run's PATH is never this process's concern).
_CP = shutil.which("cp", path="/usr/bin:/bin") or "/bin/cp"

Program = Callable[[Sequence[str], Path, Mapping[str, str]], list[str]]


@dataclass(frozen=True)
class Evaluator:
    """The hold-out evaluator as the base commit declares it, and where its tree is."""

    tree: Path
    venv: Path
    requirements_hash: str
    commit: str | None
    argv: list[str]
    artifacts: list[str]
    metric_pattern: str | None
    check_pattern: str | None

    @classmethod
    def declared(
        cls, tree: Path, venv: Path, requirements_hash: str, commit: str | None, exp: Experiment
    ) -> Evaluator | None:
        if not exp.evaluator:
            return None
        return cls(
            tree,
            venv,
            requirements_hash,
            commit,
            list(exp.evaluator),
            list(exp.artifacts),
            exp.evaluator_metric_pattern,
            exp.evaluator_check_pattern,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "tree": str(self.tree),
            "venv": str(self.venv),
            "requirements_hash": self.requirements_hash,
            "commit": self.commit,
            "argv": self.argv,
            "artifacts": self.artifacts,
            "metric_pattern": self.metric_pattern,
            "check_pattern": self.check_pattern,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Evaluator:
        return cls(
            Path(raw["tree"]),
            Path(raw["venv"]),
            str(raw["requirements_hash"]),
            raw.get("commit"),
            [str(a) for a in raw["argv"]],
            [str(a) for a in raw["artifacts"]],
            raw.get("metric_pattern"),
            raw.get("check_pattern"),
        )


def evaluator_dir(settings: Settings, job_id: int) -> Path:
    """The evaluator's tree: the base commit with its hidden paths, out of every run's reach."""
    return paths.job_dir(settings, job_id) / "evaluator"


def artifacts_dir(settings: Settings, job_id: int, index: int) -> Path:
    return paths.job_dir(settings, job_id) / "artifacts" / f"{index:03d}"


def evaluate(
    settings: Settings,
    job_id: int,
    evaluator: Evaluator,
    *,
    index: int,
    arm: str,
    run_tree: Path,
    device: str,
    device_env: str | None,
    time_limit_s: float,
    program: Program,
) -> dict[str, Any]:
    """The evaluator on one run's artifacts: its metric and check values, and its log.
    CommandError when an artifact is missing or the evaluator fails or prints no value."""
    folder = artifacts_dir(settings, job_id, index)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for relative in evaluator.artifacts:
        copy_artifact(run_tree, relative, folder / relative)
    argv = command_kind.render_evaluator(evaluator.argv, evaluator.artifacts, str(folder), device)
    venv = evaluator.venv.absolute()
    gpus = confine.assigned_gpus(device_env)
    env = {
        **_ENV,
        "PATH": os.pathsep.join((str(venv / "bin"), "/usr/bin", "/bin")),
        "CUDA_VISIBLE_DEVICES": confine.visible_inside(gpus) if gpus else (device_env or ""),
    }
    tree = evaluator.tree.absolute()
    policy = bwrap.Policy(
        cwd=tree,
        env=env,
        # Its own tree, the venv and the run's artifacts, all read-only: one evaluation leaves
        # nothing for the next, and no run reaches any of it.
        read_only=[
            tree,
            venv,
            *(Path(p) for p in inherited_site_dirs(venv)),
            folder.absolute(),
        ],
        # Its GPUs only, numbered inside as the runs' are (`confine.visible_inside`).
        devices=confine.gpu_nodes(device_env),
        network=False,
    )
    name = f"{index:03d}-{arm}-evaluator.log"
    log = paths.runs_dir(settings, job_id) / name
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    what = f"the evaluator {shlex.join(evaluator.argv)}"
    try:
        code = confined.run(
            program(argv, venv, env),
            policy,
            name=f"eval-{job_id}{confine.owner_suffix()}",
            timeout_s=time_limit_s,
            log_path=log,
            sandbox=settings.sandbox == "on",
        )
    except SandboxTimeout:
        raise command_kind.CommandError(
            f"{what} ran past its time limit of {time_limit_s:g} s"
        ) from None
    except OSError as exc:
        raise command_kind.CommandError(f"{what} cannot start: {exc}") from None
    text = log.read_text(encoding="utf-8", errors="replace")
    if code != 0:
        shown = "\n".join(text.splitlines()[-TAIL_LINES:])[-2000:]
        raise command_kind.CommandError(f"{what} exited with {code}:\n{shown}")
    found: dict[str, Any] = {"log": f"runs/{name}", "value": None, "check": None}
    for key, pattern in (("value", evaluator.metric_pattern), ("check", evaluator.check_pattern)):
        if pattern is not None:
            compiled = command_kind.check_pattern(pattern, f"evaluator {key} pattern")
            found[key] = command_kind.read_pattern(
                [text], compiled, "last", f"the evaluator's {key} pattern"
            )
    return found


def fresh_tree(pristine: Path, dest: Path) -> None:
    """A copy of the arm's export for one run (docs/design.md, "Hosts and boundaries"): nothing
    a run writes (a cache, a planted start-up file) reaches the next, and the export itself is
    never a run's. `cp -a` keeps links as links, FIFOs as FIFOs and modes as they are, never
    reading through what `setup` left; `--reflink=auto` shares blocks where the file system
    can. OSError if it cannot be made."""
    remove_tree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(  # noqa: S603 - fixed argv, our own paths
        [_CP, "--reflink=auto", "-a", "--", str(pristine), str(dest)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise OSError(f"cannot copy {pristine} to {dest}: {done.stderr.strip()[-500:]}")


def remove_tree(path: Path) -> None:
    """Remove a run's tree whatever the run made of it: a folder it left unwritable or
    unreadable is opened up first (never through a link)."""
    if not os.path.lexists(path):
        return
    try:
        shutil.rmtree(path)
        return
    except OSError:
        pass
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.chmod(path, stat.S_IRWXU)
    for folder, names, _files in os.walk(path):
        for name in [*names, ""]:
            inner = os.path.join(folder, name) if name else folder
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(os.lstat(inner).st_mode):
                    os.chmod(inner, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)


def _open_folder(tree: Path, parts: Sequence[str]) -> int:
    """An fd of the folder `tree/<parts...>`, opened one name at a time without following a
    link: a run could have planted one (`out -> /etc`) for the runner, outside its sandbox."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tree, flags)
    try:
        for part in parts:
            inner = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlink_inside(tree: Path, relative: str) -> None:
    """Remove the file `relative` from `tree` if it is there, never through a link."""
    *folders, name = relative.split("/")
    try:
        fd = _open_folder(tree, folders)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def copy_artifact(tree: Path, relative: str, dest: Path) -> None:
    """Copy the artifact `relative` the run wrote in `tree` to `dest`: a plain file, never read
    through a link or from a FIFO, at most MAX_ARTIFACT bytes."""
    *folders, name = relative.split("/")
    try:
        folder = _open_folder(tree, folders)
        try:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(name, flags, dir_fd=folder)
        finally:
            os.close(folder)
    except FileNotFoundError:
        raise command_kind.CommandError(f"the run wrote no artifact {relative!r}") from None
    except OSError as exc:
        raise command_kind.CommandError(
            f"artifact {relative!r} is not a plain file in the run's tree ({exc.strerror})"
        ) from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            raise command_kind.CommandError(f"artifact {relative!r} is not a plain file")
        with open(dest, "wb") as out:
            copied = 0
            while chunk := source.read(1 << 20):
                copied += len(chunk)
                if copied > MAX_ARTIFACT:
                    raise command_kind.CommandError(
                        f"artifact {relative!r} is over {MAX_ARTIFACT} bytes"
                    )
                out.write(chunk)
