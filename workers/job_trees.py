"""A GPU host's finished job trees, removed: each job exports its commit (and a command job its
base commit) under `jobs/<id>/`, and a busy host would fill its disk with them. What a job
leaves for people (its log, `result.json`, its runs' logs, `arms.json`) stays; the exports and
what `setup` wrote into them go once the job has been finished for `job_tree_keep_s`, or once
its row is gone (a deleted project's jobs). So do the fresh copies a command job's runs ran in
(`runs/<run>/`, each removed after its run, but left behind by a worker killed mid-run).

One worker of a host sweeps at a time, at most every `SWEEP_EVERY_S` for the host (a lock and a
stamp file in `jobs/`), in a thread of its own off the GPU's path, and only trees of jobs the
ops DB says are finished: a job prepared ahead, waiting, reserved or running keeps its tree
however old it is. The host's reservation claims (`claims.py`) older than that go too."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path

from app.clock import utcnow
from app.db import Stores
from app.jobs import paths
from app.jobs import service as jobs
from app.settings import Settings
from workers.gpu.claims import Claims

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 300.0
CHUNK = 500  # ids a query: PostgreSQL's driver takes at most 65,535 parameters a statement
_TREES = ("src", "base")
LOCK, STAMP = ".sweep.lock", ".swept"


def sweep_in_background(stores: Stores, settings: Settings) -> None:
    """Start a sweep in a daemon thread when this host's last one is `SWEEP_EVERY_S` old."""
    if _due(_folder(settings)):
        threading.Thread(
            target=sweep_if_due, args=(stores, settings), name="job-trees", daemon=True
        ).start()


def sweep_if_due(stores: Stores, settings: Settings) -> int:
    """`sweep` unless another worker of this host is sweeping or swept less than
    `SWEEP_EVERY_S` ago; never raises: a tree left is swept next time."""
    folder = _folder(settings)
    if not folder.is_dir():
        return 0
    try:
        with open(folder / LOCK, "a+b") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
            if not _due(folder):
                return 0
            (folder / STAMP).touch()
            return sweep(stores, settings)
    except Exception:
        log.warning("removing finished job trees failed; the next sweep retries", exc_info=True)
        return 0


def sweep(stores: Stores, settings: Settings) -> int:
    """Remove the exported trees of this host's jobs finished more than `job_tree_keep_s` ago
    (or deleted); returns how many jobs' trees went."""
    try:
        with_trees = {
            int(entry.name): entry
            for entry in _folder(settings).iterdir()
            if entry.name.isdigit() and _trees_of(entry)
        }
    except FileNotFoundError:
        return 0
    before = utcnow() - timedelta(seconds=settings.job_tree_keep_s)
    ids = sorted(with_trees)
    kept: set[int] = set()
    for start in range(0, len(ids), CHUNK):
        with stores.ops_session() as session:
            kept |= jobs.kept_among(session, ids[start : start + CHUNK], before)
    removed = 0
    for job_id in ids:
        if job_id in kept:
            continue
        try:
            for tree in _trees_of(with_trees[job_id]):
                _remove(tree)
            removed += 1
        except OSError:
            log.warning("job %s: its trees could not be removed", job_id, exc_info=True)
    if removed:
        log.info("removed the exported trees of %d finished job(s)", removed)
    Claims(settings.state_dir).sweep(max(settings.job_tree_keep_s, settings.lease_ttl_s))
    return removed


def _trees_of(job_folder: Path) -> list[Path]:
    """The job's exports and the run copies a killed worker left in `runs/` (folders only: the
    runs' logs are files)."""
    trees = [job_folder / tree for tree in _TREES if (job_folder / tree).is_dir()]
    runs = job_folder / "runs"
    if runs.is_dir():
        trees += [entry for entry in runs.iterdir() if entry.is_dir() and not entry.is_symlink()]
    return trees


def _folder(settings: Settings) -> Path:
    return paths.job_dir(settings, 0).parent


def _due(folder: Path) -> bool:
    with contextlib.suppress(FileNotFoundError):
        return time.time() - (folder / STAMP).stat().st_mtime >= SWEEP_EVERY_S
    return True


def _remove(tree: Path) -> None:
    """A tree the job could write into: read-only folders made writable first, so one file the
    job locked down does not keep the rest."""

    def writable(_func: object, path: str, _exc: object) -> None:
        target = Path(path)
        for item in (target.parent, target):
            if item.exists() and not item.is_symlink():
                item.chmod(item.stat().st_mode | 0o700)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)

    if tree.is_symlink():
        tree.unlink()
    elif tree.exists():
        shutil.rmtree(tree, onerror=writable)
