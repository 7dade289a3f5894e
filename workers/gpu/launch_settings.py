"""The runner's settings of each job the GPU loop runs (entry, socket budget, preload, network),
read once from the project config its preparation kept on this host."""

from __future__ import annotations

from app.errors import InvalidInput
from app.jobs import paths
from app.projects import config as project_config
from app.settings import Settings
from workers import prepare
from workers.gpu.tickets import Ticket


class LaunchSettingsCache:
    """The runner's settings of a job, read from the project config its preparation kept; the
    two last read are kept (the job running and the next one's, read for its spare)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._kept: dict[tuple[str, str], prepare.LaunchSettings] = {}

    def of(self, ticket: Ticket) -> prepare.LaunchSettings:
        key = (ticket.workdir, ticket.experiment)
        found = self._kept.get(key)
        if found is None:
            # From the copy its preparation kept, never from the export (the job's to write).
            path = paths.launch_config(self.settings, ticket.job_id)
            cfg = project_config.parse(path.read_text(encoding="utf-8"), str(path))
            found = prepare.launch_settings(cfg, ticket.experiment)
            # The next job's, read while this one ran, is then found here at its lease, off
            # the GPU's idle gap.
            self._kept = {**dict(list(self._kept.items())[-1:]), key: found}
        return found

    def of_or(self, ticket: Ticket, default: prepare.LaunchSettings) -> prepare.LaunchSettings:
        try:
            return self.of(ticket)
        except (InvalidInput, OSError):  # its run reports that; no spare is parked for it
            return default
