"""The reaper, run by the control worker on the beat schedule: lapsed leases go back to their
queue, and lost doorbells (of jobs, cycles and campaigns) are rung again."""

from __future__ import annotations

from app import broker
from app.clock import utcnow
from app.cycles import service as cycles
from app.cycles.campaigns import service as campaigns
from app.db import Stores
from app.jobs import reaping
from app.settings import Settings


def reap(stores: Stores, settings: Settings) -> reaping.Reaped:
    """Requeue lapsed leases, then ring the doorbells of jobs that waited too long."""
    with stores.ops_session() as session:
        reaped = reaping.reap(session, settings)
        stale_cycles = cycles.stale(session, settings, utcnow())
        stale_campaigns = campaigns.stale(session, settings, utcnow())
    for cycle_id in stale_cycles:
        broker.ring_advance(settings, cycle_id)
    for campaign_id in stale_campaigns:
        broker.ring_campaign(settings, campaign_id)
    # Preparation happens on the GPU hosts: a job no host has prepared rings its kind's queue.
    for queue in dict.fromkeys([*reaped.prepare_queues, *reaped.run_doorbells]):
        broker.ring_gpu(settings, queue)
    return reaped
