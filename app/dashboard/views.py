"""The data each dashboard page shows, gathered from the services (read-only)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from markupsafe import Markup
from sqlalchemy.orm import Session

from app.clock import aware
from app.cycles import service as cycles
from app.cycles.headline import interval_text
from app.cycles.models import Cycle, CycleStep
from app.dashboard import evidence
from app.dashboard.grounds import Grounds
from app.db import Stores
from app.errors import AutopilotError
from app.forge.base import ProjectRef, PullRequest
from app.forge.local import LocalForge
from app.jobs import figures, gangs, preparation
from app.jobs import service as jobs
from app.jobs.models import Job
from app.memory import service as memory
from app.memory.models import Finding
from app.memory.schemas import FindingOut
from app.projects import service as ops
from app.projects.models import Project
from app.reports import cycle as report
from app.settings import Settings

# faster/slower judge a time metric; better/worse any other (a command experiment's metric).
VERDICTS = ("faster", "slower", "better", "worse", "inconclusive", "rejected_accuracy")
REVIEW_STATES = ("awaiting_review", "approved", "rejected")
RECENT_DECISIONS = 25


def duration(start: datetime | None, end: datetime | None) -> str:
    a, b = aware(start), aware(end)
    if a is None or b is None:
        return "–"
    seconds = (b - a).total_seconds()
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def ratio_text(headline: dict[str, Any] | None) -> str:
    h = headline or {}
    interval = interval_text(h)
    if interval is None:
        try:
            return f"{float(h['ratio']):.3f}"
        except (KeyError, TypeError, ValueError):
            return "–"
    return interval


def accuracy_text(headline: dict[str, Any] | None) -> str:
    value = (headline or {}).get("accuracy_pass")
    return "–" if value is None else ("pass" if value else "fail")


def unverified(finding: Finding | FindingOut) -> bool:
    """Not (yet) confirmed: awaiting a reviewer, or without a verified primary source."""
    return finding.status == "proposed" or finding.source_status == "unverified"


@dataclass
class QueueRow:
    cycle: Cycle
    project: str
    unverified: int = 0


def review_queue(
    stores: Stores,
    *,
    project: str | None = None,
    verdict: str | None = None,
    state: str | None = None,
) -> tuple[list[QueueRow], list[QueueRow], list[str]]:
    """(awaiting review, oldest first; recent decisions, newest first; all project names)."""
    with stores.ops_session() as session:
        names = ops.project_names(session)
        wanted = [state] if state in REVIEW_STATES else list(REVIEW_STATES)
        rows: list[Cycle] = []
        for name in wanted:
            limit = 200 if name == "awaiting_review" else RECENT_DECISIONS
            rows.extend(
                cycles.list_cycles(session, project=project or None, state=name, limit=limit)[0]
            )
        for row in rows:
            session.expunge(row)
    if verdict:
        rows = [c for c in rows if c.verdict == verdict]
    ids = [fid for c in rows for fid in (c.finding_ids or [])]
    flagged: dict[str, bool] = {}
    with stores.memory_session() as msession:
        for fid in ids:
            try:
                flagged[fid] = unverified(memory.get(msession, fid))
            except AutopilotError:
                flagged[fid] = True
    made = [
        QueueRow(
            c, names.get(c.project_id, "?"), sum(flagged.get(f, False) for f in c.finding_ids or [])
        )
        for c in rows
    ]
    waiting = sorted(
        (r for r in made if r.cycle.state == "awaiting_review"), key=lambda r: r.cycle.id
    )
    decided = sorted(
        (r for r in made if r.cycle.state != "awaiting_review"),
        key=lambda r: aware(r.cycle.updated_at) or datetime.min.replace(tzinfo=UTC),
        reverse=True,
    )
    return waiting, decided[:RECENT_DECISIONS], sorted(names.values())


@dataclass
class CycleRow:
    cycle: Cycle
    project: str
    steps: list[CycleStep]

    @property
    def elapsed(self) -> str:
        if not self.steps:
            return "–"
        end = self.steps[-1].finished_at or datetime.now(UTC)
        return duration(self.steps[0].started_at, end)


def cycle_list(
    stores: Stores, *, project: str | None = None, state: str | None = None
) -> tuple[list[CycleRow], list[str]]:
    with stores.ops_session() as session:
        names = ops.project_names(session)
        rows = [
            CycleRow(c, names.get(c.project_id, "?"), list(cycles.steps(session, c.id)))
            for c in cycles.list_cycles(session, project=project or None, state=state or None)[0]
        ]
        session.expunge_all()
    return rows, sorted(names.values())


@dataclass
class CyclePage:
    """A cycle's review page: each fact of the comparison once (the whole report has a page of
    its own, `ReportPage`)."""

    cycle: Cycle
    project: Project
    steps: list[CycleStep]
    job: Job | None
    pull_request: PullRequest | None = None
    grounds: Grounds = field(default_factory=lambda: Grounds.of({}, None))
    results_html: Markup | None = None
    has_plot: bool = False
    has_report: bool = False
    environment: list[tuple[str, str]] = field(default_factory=list)
    diff: str | None = None
    comments: list[str] = field(default_factory=list)
    log_tail: str | None = None
    findings: list[Finding] = field(default_factory=list)
    related: list[Finding] = field(default_factory=list)

    @property
    def what_changed(self) -> str:
        proposal = self.cycle.proposal or {}
        return self.cycle.changed_hypothesis or str(proposal.get("what_changed") or "")


def cycle_and_project(stores: Stores, cycle_id: int) -> tuple[Cycle, ProjectRef]:
    """A cycle (detached) and its project's reference; NotFound when there is no such cycle."""
    with stores.ops_session() as session:
        cycle = cycles.get(session, cycle_id)
        ref = ProjectRef.of(ops.get_project_by_id(session, cycle.project_id))
        session.expunge(cycle)
    return cycle, ref


def cycle_page(settings: Settings, stores: Stores, cycle_id: int) -> CyclePage:
    """Everything the PR detail shows. Outside calls (git, forge) run after the session closes."""
    with stores.ops_session() as session:
        cycle = cycles.get(session, cycle_id)
        page = CyclePage(
            cycle=cycle,
            project=ops.get_project_by_id(session, cycle.project_id),
            steps=list(cycles.steps(session, cycle_id)),
            job=jobs.for_cycle(session, cycle.id),
        )
        session.expunge_all()
    ref = ProjectRef.of(page.project)
    if cycle.pr_number is not None and settings.forge == "local":
        try:
            page.pull_request = LocalForge(settings, stores).get_pull_request(ref, cycle.pr_number)
        except AutopilotError:
            page.pull_request = None
    page.has_plot = evidence.report_file(settings, stores, cycle, ref, "plot.svg") is not None
    page.has_report = cycle.commit_sha is not None
    result = evidence.result_json(evidence.report_file(settings, stores, cycle, ref, "result.json"))
    if not result and page.job is not None and isinstance(page.job.result, dict):
        result = page.job.result
    page.grounds = Grounds.of(result, cycle.headline)
    if result:
        page.results_html = evidence.render_markdown("\n".join(report.results_table(result)))
    page.environment = evidence.environment(result)
    page.diff = evidence.diff(settings, stores, ref, cycle)
    page.comments = evidence.comments(settings, stores, ref, cycle.pr_number)
    page.log_tail = evidence.log_tail(settings, page.job)
    own = set(cycle.finding_ids or [])
    with stores.memory_session() as msession:
        for fid in cycle.finding_ids or []:
            try:
                page.findings.append(memory.get(msession, fid))
            except AutopilotError:
                continue
        text = " ".join(filter(None, [cycle.experiment, cycle.hypothesis]))
        page.related = [
            f for f in memory.related(msession, page.project.name, text, k=8) if f.id not in own
        ]
        msession.expunge_all()
    return page


@dataclass
class ReportPage:
    """A cycle's whole report, REPORT.md as its commit holds it, and the pull request's body as
    the local forge keeps it (on GitHub, GitHub shows it)."""

    cycle: Cycle
    report_html: Markup | None = None
    pr_body_html: Markup | None = None


def report_page(settings: Settings, stores: Stores, cycle_id: int, plot_url: str) -> ReportPage:
    """The cycle's whole report, its plot from `plot_url`; NotFound when there is no such
    cycle. Read from git and the forge after the session closes."""
    cycle, ref = cycle_and_project(stores, cycle_id)
    page = ReportPage(cycle)
    has_plot = evidence.report_file(settings, stores, cycle, ref, "plot.svg") is not None
    shown_plot = plot_url if has_plot else None
    report_md = evidence.report_file(settings, stores, cycle, ref, "REPORT.md")
    if report_md:
        page.report_html = evidence.render_markdown(report_md, plot_url=shown_plot)
    if cycle.pr_number is not None and settings.forge == "local":
        try:
            pull = LocalForge(settings, stores).get_pull_request(ref, cycle.pr_number)
        except AutopilotError:
            pull = None
        if pull is not None and pull.body:
            page.pr_body_html = evidence.render_markdown(
                pull.body,
                plot_url=shown_plot,
                plot_link=f"{settings.dashboard_base_url}/cycles/{cycle.id}/plot.svg",
            )
    return page


@dataclass
class BudgetRow:
    scope: str
    gpu_hours_used: float
    gpu_hours_limit: float | None
    active: int
    concurrent_limit: int | None


def budgets(session: Session, settings: Settings) -> list[BudgetRow]:
    """GPU-hours in the last 24 h and GPUs in use now, against both limits (docs/design.md,
    "Separate budgets for average and peak")."""
    day_ago = datetime.now(UTC) - timedelta(days=1)
    scopes: list[tuple[str, int | None, float | None, int | None]] = [
        ("global", None, settings.budget_gpu_hours_per_day, settings.budget_concurrent_gpus)
    ]
    scopes += [
        (f"project {p.name}", p.id, p.budget_gpu_hours_per_day, p.budget_concurrent_gpus)
        for p in ops.list_projects(session)
    ]
    rows = []
    for scope, project_id, hours_limit, concurrent_limit in scopes:
        used_h, active = figures.gpu_use(session, project_id, day_ago)
        rows.append(BudgetRow(scope, used_h, hours_limit, active, concurrent_limit))
    return rows


@dataclass
class QueuePage:
    queues: list[dict[str, Any]]
    jobs_by_queue: dict[str, list[Job]]
    workers: Sequence[Any]
    budgets: list[BudgetRow]
    projects: dict[int, str]
    building: dict[int, str]  # job id -> "building venv: 37 packages, 12 s"
    #: worker -> the job of several GPUs it is seated in (app/jobs/gangs.py)
    seats: dict[str, int] = field(default_factory=dict)


def gpu_queue(settings: Settings, stores: Stores) -> QueuePage:
    with stores.ops_session() as session:
        waiting: dict[str, list[Job]] = {}
        for state in ("running", "leased", "reserved", "queued"):
            for job in jobs.list_jobs(session, state=state, limit=100):
                waiting.setdefault(job.queue, []).append(job)
        for queue_jobs in waiting.values():
            queue_jobs.sort(
                key=lambda j: (aware(j.order_key) or datetime.min.replace(tzinfo=UTC), j.id)
            )
        page = QueuePage(
            queues=figures.queues(session, settings),
            jobs_by_queue=waiting,
            workers=list(jobs.list_workers(session)),
            budgets=budgets(session, settings),
            projects=ops.project_names(session),
            building=preparation.building_venvs(
                session, [j.id for q in waiting.values() for j in q if j.state == "queued"]
            ),
            seats=gangs.seated_workers(session),
        )
        session.expunge_all()
    return page
