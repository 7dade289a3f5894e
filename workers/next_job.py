"""What a GPU worker does about its next job while the current one runs: reserve it
(`app/jobs/reservations.py`), keep the reservation, park its interpreter and stage it
(`launcher/staging.py`), so that the current job's exit starts it with one pipe write.
A mixin of `gpu.RunLoop`, which holds the state named here."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sqlalchemy.orm import Session

from app.db import Stores
from app.jobs import reservations
from app.settings import Settings
from workers import prepare
from workers.launcher import confine, runtime, staging
from workers.launcher.launch import LaunchError, LaunchSpec
from workers.launcher.spare import Spare, SpareSlot
from workers.tickets import Ticket, WorkerIdentity

log = logging.getLogger(__name__)


class NextJob:
    stores: Stores
    settings: Settings
    me: WorkerIdentity
    spares: SpareSlot | None
    pending_cleanup: list[runtime.RuntimeDir]
    reserved: Ticket | None
    _reservation_lost: int | None  # the reserved job whose reservation was lost
    _staged: tuple[int, staging.Staged] | None

    def _launch(self, ticket: Ticket) -> prepare.LaunchSettings:
        raise NotImplementedError

    def _take_reservation(self) -> Ticket | None:
        ticket, self.reserved = self.reserved, None
        lost, self._reservation_lost = self._reservation_lost, None
        started = self._staged is not None and self._staged[1].proc is not None
        if ticket is not None and lost == ticket.job_id and not started:
            self._abandon(self._staged)
            self._staged = None
            return None
        # (lost but already started: recording its start fails, and that kills it)
        return ticket

    def _release_reservation(self) -> None:
        staged, self._staged = self._staged, None
        self._abandon(staged)
        ticket, self.reserved = self.reserved, None
        if ticket is not None:
            try:
                with self.stores.ops_session() as session:
                    reservations.release(session, ticket.job_id, self.me.name)
            except Exception:  # the reaper returns it to the queue when its lease lapses
                log.warning("job %s: reservation not released", ticket.job_id, exc_info=True)

    def renew_reservation(self, session: Session) -> None:
        """Called by the running job's heartbeat (same transaction): keep the reservation."""
        ticket = self.reserved
        if ticket is not None and not reservations.renew(
            session, self.settings, ticket.job_id, self.me.name
        ):
            self._reservation_lost = ticket.job_id

    def _reserve(self) -> Ticket | None:
        """Reserve the job to run after the current one; None when none fits (a hint: any
        failure leaves the next job to be leased when this one ends)."""
        if not self.settings.gpu_reserve_next or self.reserved is not None:
            return self.reserved
        try:
            with self.stores.ops_session() as session:
                job = reservations.reserve_next(
                    session,
                    self.settings,
                    queue=self.me.queue,
                    worker=self.me.name,
                    device=self.me.device,
                    host=self.me.host,
                )
                self.reserved = Ticket.of(job, reserved=True) if job is not None else None
        except Exception:
            log.warning("could not reserve the next job", exc_info=True)
        return self.reserved

    def _launch_spec(
        self, ticket: Ticket, launch_settings: prepare.LaunchSettings
    ) -> tuple[Spare | None, LaunchSpec]:
        """The job's parked interpreter (if the worker's fits it) and what the runner starts."""
        spare = (
            self.spares.take(
                venv=ticket.venv,
                suffix_len=launch_settings.socket_suffix_len,
                preload=launch_settings.preload,
                workdir=ticket.workdir,
                network=launch_settings.network,
            )
            if self.spares is not None
            else None
        )
        rt = spare.runtime if spare is not None else None
        if rt is None:
            rt = runtime.allocate_runtime(
                state_dir=self.settings.state_dir.absolute(),
                env=os.environ,
                suffix_len=launch_settings.socket_suffix_len,
            )
        launch = LaunchSpec(
            venv=Path(ticket.venv),
            entry=str(launch_settings.entry),
            cwd=Path(ticket.workdir),
            runtime=rt,
            spec=ticket.spec,
            cuda_visible_devices=self.me.device or None,
            pythonpath=[Path(ticket.workdir)],
            base_env=dict(os.environ),
            requirements_hash=launch_settings.requirements_hash,
            sandboxed=self.settings.sandbox == "on",
            network=launch_settings.network,
            cgroup=confine.job_cgroup_name(ticket.job_id),
        )
        return spare, launch

    def _stage_next(self, reserved: Ticket, launch_settings: prepare.LaunchSettings) -> None:
        """Make the reserved job ready to start (its parked interpreter just started for it),
        so that the current job's exit starts it with one pipe write (`_go_next`)."""
        if self._staged is not None or reserved.spec.get("kind") == "command":
            return
        spare, launch = self._launch_spec(reserved, launch_settings)
        if spare is None:  # a cold start is what the runner does best at the time
            self.pending_cleanup.append(launch.runtime)
            return
        try:
            self._staged = (reserved.job_id, staging.stage(launch, spare))
        except (LaunchError, OSError):
            log.warning("job %s: could not stage it ahead", reserved.job_id, exc_info=True)
            self.pending_cleanup.append(launch.runtime)

    def _go_next(self) -> None:
        """The running job has exited: start the staged next job now (before anything else)."""
        if self._staged is not None and self._reservation_lost != self._staged[0]:
            try:
                self._staged[1].go()
            except LaunchError:  # its run (`run_job`) tries again, cold
                log.warning("job %s: the staged start failed", self._staged[0], exc_info=True)

    def _staged_for(self, ticket: Ticket) -> staging.Staged | None:
        found, self._staged = self._staged, None
        if found is not None and found[0] == ticket.job_id:
            return found[1]
        self._abandon(found)
        return None

    def _abandon(self, found: tuple[int, staging.Staged] | None) -> None:
        if found is not None:
            found[1].abandon()
            self.pending_cleanup.append(found[1].job.runtime)
