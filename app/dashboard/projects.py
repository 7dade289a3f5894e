"""The projects on the dashboard: a list, and one project's page showing how it has moved across
its cycles (the trend of the headline ratio with the best so far, each experiment's parameter
map coloured by verdict, each mark linking to its cycle), the GPU time each decision took
(`gpu_time.py`), its budgets and its validated findings. The trend and the maps are the API's
`GET /api/v1/projects/{name}/plot` SVGs, inlined so their points are links. A live page
(`live.py`, topic `cycles`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Request
from fastapi.responses import Response
from markupsafe import Markup

from app.api.deps import SettingsDep, StoresDep
from app.cycles import progress, states
from app.cycles import service as cycles
from app.cycles.progress import Point, Progress
from app.dashboard import gpu_time, live
from app.dashboard.auth import PREFIX
from app.dashboard.pages import MaybeViewer, from_exception, render, to_login
from app.dashboard.views import BudgetRow
from app.db import Stores
from app.errors import AutopilotError
from app.jobs import figures
from app.memory import service as memory
from app.memory.schemas import FindingOut
from app.projects import service as ops
from app.projects.models import Project
from app.reports import progress_plot
from app.settings import Settings

router = APIRouter(include_in_schema=False)
SHOWN_FINDINGS = 50


@dataclass
class ProjectRow:
    project: Project
    cycles: int


@dataclass
class Chart:
    title: str
    svg: Markup


@dataclass
class ProjectPage:
    project: Project
    progress: Progress
    budget: BudgetRow
    best: list[Point] = field(default_factory=list)
    trend: Chart | None = None
    without_ratio: int = 0
    maps: list[Chart] = field(default_factory=list)
    findings: list[FindingOut] = field(default_factory=list)
    more_findings: bool = False
    spend: gpu_time.Spend = field(default_factory=lambda: gpu_time.Spend([]))
    spend_chart: Chart | None = None

    @property
    def live(self) -> bool:
        return any(p.state in states.LIVE for p in self.progress.points)


def project_list(stores: Stores) -> list[ProjectRow]:
    with stores.ops_session() as session:
        rows = [
            ProjectRow(p, cycles.list_cycles(session, project=p.name, limit=1)[1])
            for p in ops.list_projects(session)
        ]
        session.expunge_all()
    return rows


def _svg(text: str) -> Markup:
    # matplotlib escapes every text it writes; `progress_plot.inline` escapes the link names.
    return Markup(text)  # noqa: S704 - our own chart, with no script and no inline style


def project_page(settings: Settings, stores: Stores, name: str) -> ProjectPage:
    """Everything the project page shows; ProjectNotFound when no project has that name."""
    found = progress.load(settings, stores, name)
    with stores.ops_session() as session:
        project = ops.get_project(session, name)
        used_h, active = figures.gpu_use(session, project.id, datetime.now(UTC) - timedelta(days=1))
        spent = gpu_time.spend(session, name)
        session.expunge(project)
    budget = BudgetRow(
        f"project {name}",
        used_h,
        project.budget_gpu_hours_per_day,
        active,
        project.budget_concurrent_gpus,
    )
    page = ProjectPage(project, found, budget, spend=spent)
    if svg := spent.chart():
        page.spend_chart = Chart("GPU time per decision", svg)
    if found.points:
        chart = progress.trend(found)
        page.without_ratio = chart.without_ratio
        page.best = list(chart.best.values())
        if chart.points:
            page.trend = Chart("Trend", _svg(progress_plot.trend_svg(found, chart)))
        page.maps = [
            Chart(e, _svg(progress_plot.space_svg(progress.space_map(found, e))))
            for e in found.experiments
        ]
    with stores.memory_session() as msession:
        result = memory.search(msession, project=name, status="validated", limit=SHOWN_FINDINGS)
    page.findings, page.more_findings = list(result.items), result.next_offset is not None
    return page


@router.get(PREFIX + "/projects")
def projects(request: Request, viewer: MaybeViewer, stores: StoresDep) -> Response:
    if viewer is None:
        return to_login(request)
    return render(request, "projects.html", viewer, rows=project_list(stores))


@router.get(PREFIX + "/projects/{name}")
def project(
    request: Request, viewer: MaybeViewer, stores: StoresDep, settings: SettingsDep, name: str
) -> Response:
    if viewer is None:
        return to_login(request)
    version = live.version(stores, "cycles")  # read before the data: a change between is seen
    try:
        page = project_page(settings, stores, name)
    except AutopilotError as exc:
        return from_exception(request, viewer, exc)
    return render(
        request,
        "project.html",
        viewer,
        page=page,
        live=page.live,
        live_topic="cycles",
        live_version=version,
    )
