"""A GPU host's finished job trees, removed: each job exports its commit (and a command job its
base commit) under `jobs/<id>/`, and a busy host would fill its disk with them. What a job
leaves for people (its log, `result.json`, its runs' logs, `arms.json`) stays; the exports and
what `setup` wrote into them go once the job has been finished for `job_tree_keep_s`.

A GPU worker sweeps at most every `SWEEP_EVERY_S`, off the GPU's path (the worker's cleanup
thread, or once its queue is empty), and only trees of jobs the ops DB says are finished: a job
prepared ahead, waiting, reserved or running keeps its tree however old it is."""

from __future__ import annotations

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

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 300.0
_TREES = ("src", "base")
_lock = threading.Lock()
_last_sweep = -SWEEP_EVERY_S


def sweep_if_due(stores: Stores, settings: Settings) -> int:
    """`sweep` unless this process swept less than `SWEEP_EVERY_S` ago (or another thread of
    it is sweeping now); never raises: a tree left is swept next time."""
    global _last_sweep
    if not _lock.acquire(blocking=False):
        return 0
    try:
        if time.monotonic() - _last_sweep < SWEEP_EVERY_S:
            return 0
        _last_sweep = time.monotonic()
        return sweep(stores, settings)
    except Exception:
        log.warning("removing finished job trees failed; the next sweep retries", exc_info=True)
        return 0
    finally:
        _lock.release()


def sweep(stores: Stores, settings: Settings) -> int:
    """Remove the exported trees of this host's jobs finished more than `job_tree_keep_s` ago;
    returns how many jobs' trees went."""
    folder = paths.job_dir(settings, 0).parent
    try:
        with_trees = {
            int(entry.name): entry
            for entry in folder.iterdir()
            if entry.name.isdigit() and any((entry / tree).is_dir() for tree in _TREES)
        }
    except FileNotFoundError:
        return 0
    if not with_trees:
        return 0
    before = utcnow() - timedelta(seconds=settings.job_tree_keep_s)
    with stores.ops_session() as session:
        done = jobs.finished_before(session, sorted(with_trees), before)
    for job_id in done:
        for tree in _TREES:
            _remove(with_trees[job_id] / tree)
    if done:
        log.info("removed the exported trees of %d finished job(s)", len(done))
    return len(done)


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
