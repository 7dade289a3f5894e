"""What every step shares: its place in the table (FROM_STATES → TO_STATES), the stores and
settings, and the few reads and git handles several steps need."""

from __future__ import annotations

from typing import Any, ClassVar

from app.cycles import repository, service
from app.cycles.judge import judge
from app.cycles.models import Cycle
from app.db import Stores
from app.forge.base import Forge, ProjectRef
from app.git.refs import CycleBranch, slugify
from app.git.work import GitWork
from app.jobs import service as jobs
from app.settings import Settings


class Step:
    """One step of the cycle machine. `run` returns True when it moved the cycle on (to one of
    TO_STATES), False when the cycle has to wait in its state for something outside.

    A step opens its own short sessions: none is held across git, the forge or a subprocess."""

    FROM_STATES: ClassVar[tuple[str, ...]] = ()
    TO_STATES: ClassVar[tuple[str, ...]] = ()

    def __init__(self, stores: Stores, settings: Settings) -> None:
        self.stores, self.settings = stores, settings
        self._git: GitWork | None = None

    def run(self, cycle_id: int) -> bool:
        raise NotImplementedError

    def detached(self, cycle_id: int) -> tuple[Cycle, ProjectRef]:
        """The cycle (detached, for reading outside any transaction) and its project."""
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            ref = ProjectRef.of(service.project_of(session, cycle))
            repository.detach(session, cycle)
            return cycle, ref

    def judged(self, cycle_id: int) -> tuple[Cycle, ProjectRef, str, dict[str, Any]]:
        """What `detached` reads, the project's GPU kind and the control plane's judgement of
        the cycle's job result (`judge.py`: a pure computation, so every step that asks gets
        the verdict the cycle holds), in one short session."""
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            project = service.project_of(session, cycle)
            ref, gpu_kind = ProjectRef.of(project), project.gpu_kind
            job = jobs.for_cycle(session, cycle_id)
            assert job is not None
            raw, spec = dict(job.result or {}), dict(job.spec or {})
            repository.detach(session, cycle)
        return cycle, ref, gpu_kind, judge(raw, spec)

    def git(self) -> GitWork:
        """One GitWork for the step's run: it remembers the branch tip it read or wrote last,
        so the step's later reads of it need no git."""
        if self._git is None:
            self._git = GitWork(self.settings)
        return self._git

    def branch(self, cycle: Cycle, project: ProjectRef, forge: Forge) -> CycleBranch:
        """The cycle's branch in the project's mirror, made once and reused by every later step
        (without a fetch once the cycle records its base: prepare does)."""
        slug = slugify(cycle.agent if cycle.agent != "config" else "cycle")
        return self.git().start_branch(
            project.name,
            forge.remote_url(project),
            project.default_branch,
            cycle.id,
            slug,
            base_sha=cycle.base_sha,
        )
