"""Fill the artifacts filesystem: the job fails at once with a clear error; after space is freed
the same job, submitted again, succeeds.

The state dir's `jobs/` folder (checkouts, logs, results of each job) becomes a 2 MiB tmpfs.
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.db import Stores
from tests.conftest import Backend
from tests.integration.queue.conftest import Workers, make_repo
from tests.reliability.conftest import (
    finished,
    job,
    leases_of,
    production_variant_only,
    runs,
    submit,
    variant,
)
from tests.support import wait_for
from workers import prepare

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.stores("sqlite", "postgres"),
    pytest.mark.timeout(180),
]

NO_SPACE = "No space left on device"


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "2m") -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip("no mount command here")
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs was refused: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        done = subprocess.run(["umount", str(where)], capture_output=True, timeout=30)
        if done.returncode != 0:  # something still has a file open there: detach it anyway
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill(folder: Path) -> Path:
    """Write one file until the filesystem refuses: ENOSPC. Returns the file (to free later)."""
    ballast = folder / "ballast.bin"
    chunk = b"\0" * 65536
    with open(ballast, "wb", buffering=0) as handle:
        while True:
            try:
                handle.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    # Smaller writes too, so not even a page is left.
    with open(ballast, "ab", buffering=0) as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 512)
    return ballast


def test_full_artifacts_filesystem_fails_clearly_then_retry_succeeds(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend, figures: dict[str, Any]
) -> None:
    production_variant_only(backend.name)
    settings = workers.settings
    repo = make_repo(tmp_path, "probe-full")
    jobs_dir = settings.state_dir.absolute() / "jobs"
    with small_tmpfs(jobs_dir):
        try:
            workers.start("control", "control", "--beat")
            # 1. Prepared while there was room, on this host as its GPU worker's preparer
            # would; the disk fills before it runs.
            at_run = submit(stores, settings, repo, sleep_s=0.05)
            assert prepare.prepare_job(stores, settings, at_run)
            assert job(stores, at_run).prepared_at is not None
            ballast = fill(jobs_dir)
            gpu = workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
            began = time.monotonic()
            failed_run = wait_for(lambda: finished(stores, at_run), timeout=60)
            run_fail_s = time.monotonic() - began
            assert failed_run.state == "failed", (failed_run.state, workers.logs()[-3000:])
            assert failed_run.error and NO_SPACE in failed_run.error, failed_run.error
            assert failed_run.attempts == 1  # failed once, clearly: not retried blind
            assert leases_of(stores, [at_run]) == []
            assert gpu.poll() is None  # the worker survived it

            # 2. Submitted while the disk is full: preparation fails, with the reason.
            began = time.monotonic()
            at_prepare = submit(stores, settings, repo, sleep_s=0.05)
            failed_prepare = wait_for(lambda: finished(stores, at_prepare), timeout=60)
            prepare_fail_s = time.monotonic() - began
            assert failed_prepare.state == "failed"
            assert failed_prepare.error and NO_SPACE in failed_prepare.error, failed_prepare.error

            # 3. Space freed: the same job, submitted again, runs once and succeeds.
            ballast.unlink()
            retried = submit(stores, settings, repo, sleep_s=0.05)
            done = wait_for(lambda: finished(stores, retried), timeout=120)
            assert done.state == "succeeded", (done.error, workers.logs()[-3000:])
            assert done.attempts == 1 and len(runs(settings, retried)) == 1
            assert gpu.poll() is None
        finally:
            workers.stop_all()  # nothing may keep a file open on the mount
    figures[f"disk_full[{variant(backend.name, settings)}]"] = {
        "faults_injected": 2,
        "failed_clearly": 2,
        "run_time_failure_s": round(run_fail_s, 2),
        "prepare_time_failure_s": round(prepare_fail_s, 2),
        "run_time_error": failed_run.error[:200],
        "prepare_time_error": failed_prepare.error[:200],
        "retried_after_freeing": 1,
        "retry_succeeded": 1,
        "lost": 0,
        "duplicated": 0,
    }
