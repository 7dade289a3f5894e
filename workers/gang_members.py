"""A gang job's members, seen from its leader's host (app/jobs/gangs.py): a seated worker is idle
and does not heartbeat, so whether it is up is whether its process is (workers of one host share
its process namespace: a pod's containers, a Slurm allocation's tasks, a systemd host)."""

from __future__ import annotations

import logging
import os

from sqlalchemy.orm import Session

from app.jobs import gangs, reaping
from app.jobs.models import Worker

log = logging.getLogger(__name__)


def alive(worker: Worker) -> bool:
    """Whether `worker`'s process runs on this host (one registered without a pid: no)."""
    if worker.pid is None or worker.pid <= 0:
        return False
    try:
        os.kill(worker.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user
        return True
    return True


def check(session: Session, job_id: int, leader: str) -> str | None:
    """On the leader's beat: if a member of the job's gang is gone, give the job back (it is
    retried like a job whose lease lapsed) and say why; None while all are up."""
    lost = gangs.lost_members(session, job_id, alive)
    if not lost:
        return None
    reason = f"gang member {', '.join(lost)} stopped while job {job_id} ran; its GPUs were freed"
    if reaping.give_back_gang(session, job_id, leader, reason):
        log.warning("job %s: %s; the job is given back for another attempt", job_id, reason)
    return reason
