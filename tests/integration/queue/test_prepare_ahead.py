"""Preparing ahead with several GPU workers on one host: a worker takes the next job in line
that no other worker of the host is preparing, instead of waiting on that one's lock (and then
finding it prepared): issue 18's fleet profile found the host's preparers queueing so."""

from __future__ import annotations

import fcntl
import socket
import threading
from pathlib import Path

from app.db import Stores
from app.jobs import paths, preparation
from tests.integration.queue.conftest import Workers, make_repo
from tests.integration.queue.test_workers import submit
from workers import prepare


def test_a_job_another_worker_prepares_is_left_to_it(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "ahead")
    first, second = (submit(stores, workers, repo, sleep_s=0.05) for _ in range(2))
    workers.start_api()  # the preparation fetches the job's commit from the control host
    host, settings = socket.gethostname(), workers.settings
    folder = paths.job_dir(settings, first)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "prepare.lock", "a+b") as held:  # another worker is preparing `first`
        fcntl.flock(held, fcntl.LOCK_EX)
        made: list[int] = []
        ahead = threading.Thread(
            target=lambda: made.append(prepare.prepare_ahead(stores, settings, "gpu.cpu", want=2)),
            daemon=True,
        )
        ahead.start()
        ahead.join(timeout=120)
        assert not ahead.is_alive(), "prepare_ahead waited for the job another worker holds"
        assert made == [1]
        with stores.ops_session() as session:
            assert preparation.preparation_on(session, first, host) is None
            assert preparation.ready_on(session, "gpu.cpu", host) == 1
            assert preparation.needs_preparation(session, "gpu.cpu", host, limit=8) == [first]
    # Its lock free again (that worker gone without preparing it): the next pass prepares it.
    assert prepare.prepare_ahead(stores, settings, "gpu.cpu", want=2) == 1
    with stores.ops_session() as session:
        assert preparation.ready_on(session, "gpu.cpu", host) == 2
    assert second != first
