"""The control worker's reaper task (`workers/reaper.py`) on the embedded stores and broker: what
it requeues, it rings for, and the doorbell reaches the broker."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from app import broker
from app.db import Stores
from app.settings import Settings
from tests.integration.queue.test_jobs_service import (
    expire_lease,
    lease,
    make_project,
    row,
    submit,
)
from workers import reaper


def doorbells(settings: Settings, task: str) -> list[tuple[str, list[object]]]:
    """The queue and arguments of each `task` message waiting in the filesystem broker's folder
    (kombu names each file `<time>_<id>.<queue>.msg`; the task's arguments are its body)."""
    found = []
    for path in sorted(Path(settings.broker_dir, "queue").glob("*.msg")):
        message = json.loads(path.read_text())
        if message["headers"]["task"] == task:
            queue = path.name.split(".", 1)[1].removesuffix(".msg")
            args = json.loads(base64.b64decode(message["body"]))[0]
            found.append((queue, args))
    return found


def test_the_reaper_requeues_a_lapsed_lease_and_rings_its_queue(
    stores: Stores, settings: Settings
) -> None:
    assert settings.broker_url == "filesystem://"
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha")
    assert lease(stores, settings) == job_id
    assert reaper.reap(stores, settings).requeued == []  # a live lease is left alone
    assert doorbells(settings, broker.RUN_JOBS) == []

    expire_lease(stores, job_id)
    reaped = reaper.reap(stores, settings)

    assert reaped.requeued == [job_id]
    assert row(stores, job_id).state == "queued"
    assert doorbells(settings, broker.RUN_JOBS) == [("gpu.cpu", ["gpu.cpu"])]
