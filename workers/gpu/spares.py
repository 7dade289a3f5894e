"""The GPU worker's use of its parked interpreter (`launcher/spare.py`): what a job is started
with (the spare that fits it, else a fresh runtime dir for a cold start), and a spare parked for
the job to come while the current one runs."""

from __future__ import annotations

import os
from pathlib import Path

from app.settings import Settings
from workers import prepare
from workers.gpu.tickets import Ticket, WorkerIdentity
from workers.launcher import confine, runtime
from workers.launcher.launch import LaunchSpec
from workers.launcher.spare import Spare, SpareSlot


class SparePool:
    """One worker's parked interpreters; `slot` None runs every job cold (in-process callers)."""

    def __init__(self, settings: Settings, me: WorkerIdentity, slot: SpareSlot | None) -> None:
        self.settings, self.me, self.slot = settings, me, slot

    @property
    def parking(self) -> bool:
        """Whether a spare is parked for the next job while one runs."""
        return self.slot is not None and self.settings.gpu_spare_interpreter

    def launch_spec(
        self, ticket: Ticket, launch_settings: prepare.LaunchSettings
    ) -> tuple[Spare | None, LaunchSpec]:
        """The job's parked interpreter (if the worker's fits it) and what the runner starts."""
        spare = (
            None
            if ticket.devices is not None  # a gang's job: its own devices, started cold
            else self.slot.take(
                venv=ticket.venv,
                suffix_len=launch_settings.socket_suffix_len,
                preload=launch_settings.preload,
                workdir=ticket.workdir,
                network=launch_settings.network,
            )
            if self.slot is not None
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
            cuda_visible_devices=ticket.device_env(self.me.device),
            pythonpath=[Path(ticket.workdir)],
            base_env=dict(os.environ),
            requirements_hash=launch_settings.requirements_hash,
            sandboxed=self.settings.sandbox == "on",
            network=launch_settings.network,
            cgroup=confine.job_cgroup_name(ticket.job_id),
        )
        return spare, launch

    def park_for(self, after: Ticket, hint: prepare.LaunchSettings, *, known: bool) -> bool:
        """Park an interpreter for `after` (`known`: the very job that runs next, reserved or
        first in line; else one like the running job); False when none is parked for it.

        A sandboxed spare binds its job's export: for a job not known, none is parked; a command
        job (no entry) runs no interpreter of ours."""
        sandboxed = self.settings.sandbox == "on"
        if self.slot is None or (sandboxed and not known) or hint.entry is None:
            return False
        self.slot.prestart(
            state_dir=self.settings.state_dir.absolute(),
            venv=after.venv,
            suffix_len=hint.socket_suffix_len,
            requirements_hash=hint.requirements_hash,
            preload=hint.preload,
            cuda_visible_devices=self.me.device or None,
            sandboxed=sandboxed,
            network=hint.network,
            workdir=after.workdir,
            cgroup_name=confine.job_cgroup_name(after.job_id) if known else None,
        )
        return True
