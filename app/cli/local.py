"""The CLI's backend on the control host: this host's stores through the services, answering
in the API's JSON shapes (`app.cli.backend`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import typer
from sqlalchemy.orm import Session

from app import broker
from app.cli.common import load_settings, open_stores
from app.cli.failures import describe
from app.cycles import service as cycles
from app.cycles.campaigns import service as campaigns
from app.cycles.campaigns.schemas import CampaignCreate
from app.cycles.models import Cycle
from app.cycles.schemas import CycleOut, StepOut
from app.db import Stores
from app.jobs import logs
from app.jobs import service as jobs
from app.jobs.lifecycle import FINISHED
from app.jobs.schemas import JobOut
from app.memory import service as memory
from app.projects import service as projects
from app.projects.schemas import ProjectOut
from app.settings import Settings

POLL_S = 0.2


def job_row(job: Any, project: str | None = None, **extra: Any) -> dict[str, Any]:
    """A job as the API shows it, with its project's name."""
    row = JobOut.model_validate(job).model_dump(mode="json")
    if project is not None:
        row["project"] = project
    row.update(extra)
    return row


def cycle_row(session: Session, cycle: Cycle) -> dict[str, Any]:
    out = CycleOut.model_validate(cycle)
    out.job_id = jobs.ids_for_cycles(session, [cycle.id]).get(cycle.id)
    return out.model_dump(mode="json")


class LocalBackend:
    """Each call in its own short session: the caller owns no transaction across calls."""

    @functools.cached_property
    def settings(self) -> Settings:
        return load_settings()

    @functools.cached_property
    def stores(self) -> Stores:
        return open_stores(self.settings)

    def projects(self) -> list[dict[str, Any]]:
        with self.stores.ops_session() as session:
            return [
                ProjectOut.model_validate(p).model_dump(mode="json")
                for p in projects.list_projects(session)
            ]

    def cycles(self, project: str | None, state: str | None, limit: int) -> list[dict[str, Any]]:
        with self.stores.ops_session() as session:
            rows, _ = cycles.list_cycles(session, project=project, state=state, limit=limit)
            return [cycle_row(session, c) for c in rows]

    def cycle(self, cycle_id: int) -> dict[str, Any]:
        with self.stores.ops_session() as session:
            row = cycle_row(session, cycles.get(session, cycle_id))
            row["steps"] = [
                StepOut.model_validate(s).model_dump(mode="json")
                for s in cycles.steps(session, cycle_id)
            ]
            return row

    def trigger(self, project: str, experiment: str | None, changed: str | None) -> dict[str, Any]:
        trigger = cycles.Trigger(
            project=project, experiment=experiment, changed_hypothesis=changed, trigger="cli"
        )
        with self.stores.ops_session() as session:
            cycle, _ = cycles.create(
                session, trigger, max_live=self.settings.max_live_cycles_per_project
            )
            cycle_id = cycle.id
        try:  # after the commit: a doorbell names a stored cycle
            broker.ring_advance(self.settings, cycle_id)
        except Exception as exc:  # the cycle is stored; the reaper rings it again
            typer.echo(
                f"warning: cycle {cycle_id} is stored but its doorbell was not sent: "
                f"{describe(exc)[0]}",
                err=True,
            )
        with self.stores.ops_session() as session:
            return cycle_row(session, cycles.get(session, cycle_id))

    def cancel_cycle(self, cycle_id: int) -> dict[str, Any]:
        with self.stores.ops_session() as session:
            return cycle_row(session, cycles.cancel(session, cycle_id, "cli"))

    def campaigns(self, project: str | None, state: str | None, limit: int) -> list[dict[str, Any]]:
        with self.stores.ops_session() as session:
            found = campaigns.list_campaigns(session, project=project, state=state, limit=limit)
            return [campaigns.out(session, c).model_dump(mode="json") for c in found]

    def campaign(self, campaign_id: int) -> dict[str, Any]:
        with self.stores.ops_session() as session:
            return campaigns.out(session, campaigns.get(session, campaign_id)).model_dump(
                mode="json"
            )

    def start_campaign(self, body: CampaignCreate) -> dict[str, Any]:
        with self.stores.ops_session() as session:
            campaign_id = campaigns.create(session, body, "cli").id
        self._ring_campaign(campaign_id)
        return self.campaign(campaign_id)

    def stop_campaign(self, campaign_id: int) -> dict[str, Any]:
        with self.stores.ops_session() as session:
            campaigns.stop(session, campaign_id, "cli")
        self._ring_campaign(campaign_id)
        return self.campaign(campaign_id)

    def _ring_campaign(self, campaign_id: int) -> None:
        try:  # after the commit: a doorbell names a stored campaign
            broker.ring_campaign(self.settings, campaign_id)
        except Exception as exc:  # the campaign is stored; the reaper rings it again
            typer.echo(
                f"warning: campaign {campaign_id} is stored but its doorbell was not sent: "
                f"{describe(exc)[0]}",
                err=True,
            )

    def jobs(
        self, queue: str | None, state: str | None, project: str | None, limit: int
    ) -> list[dict[str, Any]]:
        if queue is not None:
            jobs.parse_queue(self.settings, queue)
        with self.stores.ops_session() as session:
            project_id = projects.get_project(session, project).id if project else None
            names = projects.project_names(session)
            found = jobs.list_jobs(
                session, queue=queue, state=state, project_id=project_id, limit=limit
            )
            return [job_row(j, names.get(j.project_id)) for j in found]

    def job_log(self, job_id: int) -> Iterator[bytes]:
        with self.stores.ops_session() as session:
            job = jobs.get(session, job_id)
            path, tail = logs.stored_log(self.settings, job), job.log_tail
        chunks = logs.whole_log(path) if path is not None else None
        return chunks if chunks is not None else iter([(tail or "").encode("utf-8")])

    def follow_job(
        self, job_id: int, write: Callable[[str], None], say: Callable[[str], None]
    ) -> str:
        return follow_job(self.stores, self.settings, job_id, out=write, status=say)

    def search(
        self,
        query: str,
        project: str | None,
        kind: str | None,
        status: str | None,
        device_kind: str | None,
        limit: int,
    ) -> dict[str, Any]:
        with self.stores.memory_session() as session:
            page = memory.search(
                session,
                query,
                project=project,
                kind=kind,
                status=status,
                device_kind=device_kind,
                limit=limit,
            )
            return page.model_dump(mode="json")

    def finding(self, finding_id: str) -> dict[str, Any]:
        with self.stores.memory_session() as session:
            return memory.detail(session, finding_id).model_dump(mode="json")


# -- following a job ------------------------------------------------------------------------


def phase(job: Any) -> str:
    """What the job is doing, in words: the state, split where a person would ask "why?"."""
    if job.state == "queued":
        if job.prepared_at is None:
            return "queued: preparing (checkout, venv, preflight)"
        if job.wait_reason:
            return f"queued: waiting ({job.wait_reason})"
        return "queued: prepared, waiting for a GPU"
    if job.state == "reserved":
        return "reserved: next on a busy worker's GPU, once its current job ends"
    if job.state in ("leased", "running"):
        return f"{job.state} on {job.worker} (attempt {job.attempts})"
    if job.state == "succeeded":
        return f"succeeded in {job.gpu_seconds:.2f} s GPU time"
    if job.state == "cancelled":
        return f"cancelled by {job.cancelled_by or '?'}"
    return f"failed: {job.error or 'no reason recorded'}"


def follow_job(
    stores: Stores,
    settings: Settings,
    job_id: int,
    *,
    poll_s: float = POLL_S,
    out: Callable[[str], None] | None = None,
    status: Callable[[str], None] | None = None,
) -> str:
    """Print the job's new log lines and each change of its phase until it ends; its last state.

    Log lines go to stdout; the progress display (phase changes with the elapsed time) to
    stderr, so `autopilot job logs 42 -f > run.log` keeps the log clean.
    """

    def echo_out(text: str) -> None:
        typer.echo(text, nl=False)

    def echo_status(line: str) -> None:
        typer.echo(line, err=True)

    write, say = out or echo_out, status or echo_status
    follower = logs.LogFollower()
    shown = ""
    start = time.monotonic()
    try:
        while True:
            with stores.ops_session() as session:
                job = jobs.get(session, job_id)
                now_phase, state = phase(job), job.state
                finished = state in FINISHED
                # the DB's tail while a GPU host runs it; the uploaded log once there is one
                text = follower.read(settings, job, final=finished)
            if text:
                write(text if text.endswith("\n") else text + "\n")
            if now_phase != shown:
                shown = now_phase
                stamp = datetime.now(UTC).strftime("%H:%M:%S")
                say(f"[{stamp} +{time.monotonic() - start:6.1f}s] job {job_id} {now_phase}")
            if follower.behind:
                continue
            if finished:
                return state
            time.sleep(poll_s)
    except KeyboardInterrupt:
        say(f"stopped following; job {job_id} goes on (autopilot job cancel {job_id} stops it)")
        raise typer.Exit(130) from None
