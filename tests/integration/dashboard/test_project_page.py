"""The project pages over HTML: the list, a project without cycles (no empty chart), and one
with cycles (inline charts whose points link to the cycles, best so far, the GPU time of each
decision, budgets, validated findings), live like the cycle pages."""

from __future__ import annotations

import re
import statistics
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select

from app.cycles.models import Cycle
from app.db import Stores
from app.jobs.models import Job
from app.memory import service as memory
from app.projects import service as ops
from tests.integration.dashboard.conftest import CycleFactory, login, stopped_command_result

ROW = re.compile(
    r'<tr data-cycle="(\d+)"><td data-label="Job finished \(UTC\)" class="num">([^<]+)</td>'
    r'.*?class="num gpu-s">([0-9.]+)</td>',
    re.S,
)


def test_project_list_links_each_project(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory
) -> None:
    login(client, tokens["reader"])
    assert "No projects yet" in client.get("/dashboard/projects").text
    cycles.make()
    page = client.get("/dashboard/projects").text
    assert 'href="/dashboard/projects/probe-dash"' in page
    listed = client.get("/dashboard/cycles").text  # the cycles list links the project too
    assert 'href="/dashboard/projects/probe-dash"' in listed


def test_project_without_cycles_says_so_and_draws_no_chart(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory
) -> None:
    cycles.project()
    login(client, tokens["reader"])
    page = client.get("/dashboard/projects/probe-dash")
    assert page.status_code == 200
    assert "No cycles yet for this project" in page.text
    assert "<svg" not in page.text
    assert 'data-live-url="/dashboard/live/cycles"' in page.text  # the first cycle will show


def test_project_page_shows_charts_best_budgets_and_validated_findings(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory, stores: Stores
) -> None:
    made = [cycles.make(), cycles.make(verdict="slower"), cycles.make(verdict="inconclusive")]
    with stores.memory_session() as session:
        memory.validate(session, made[0].finding_ids[0], "alice")
    with stores.ops_session() as session:
        project = ops.get_project(session, "probe-dash")
        ops.set_budgets(session, project, gpu_hours_per_day=3.0, concurrent_gpus=2)
    login(client, tokens["reader"])
    response = client.get("/dashboard/projects/probe-dash")
    assert response.status_code == 200
    page = response.text
    # Inline SVG, fit for the page's CSP: no inline style anywhere.
    assert "style-src 'self'" in response.headers["content-security-policy"]
    assert page.count('<svg class="chart"') == 2 and " style=" not in page
    for m in made:
        assert page.count(f'<a href="/dashboard/cycles/{m.cycle_id}"') >= 2  # trend and map
    assert f'<a href="/dashboard/cycles/{made[0].cycle_id}">cycle {made[0].cycle_id}</a>' in page
    assert "0.00 / 3" in page and "0 / 2" in page
    assert f'href="/dashboard/memory/{made[0].finding_ids[0]}"' in page
    assert f'href="/dashboard/memory/{made[1].finding_ids[0]}"' not in page  # still proposed
    assert 'data-live-url="/dashboard/live/cycles"' in page
    detail = client.get(f"/dashboard/cycles/{made[0].cycle_id}").text
    assert 'href="/dashboard/projects/probe-dash"' in detail


def test_unknown_project_is_a_404_page(client: TestClient, tokens: dict[str, str]) -> None:
    login(client, tokens["reader"])
    page = client.get("/dashboard/projects/nope")
    assert page.status_code == 404 and "no project named" in page.text


def test_project_page_needs_sign_in(client: TestClient) -> None:
    response = client.get("/dashboard/projects/probe-dash", follow_redirects=False)
    assert response.status_code == 303 and "/dashboard/login" in response.headers["location"]


def _stored_decisions(stores: Stores) -> list[tuple[int, float, datetime]]:
    """(cycle, its job's GPU seconds, when that job finished) of every judged cycle, oldest
    first, read from the ops DB's rows as they are stored."""
    with stores.ops_session() as session:
        rows = session.execute(
            select(Job.cycle_id, Job.gpu_seconds, Job.finished_at)
            .join(Cycle, Cycle.id == Job.cycle_id)
            .where(Cycle.verdict.is_not(None), Job.finished_at.is_not(None))
        ).all()
    made = [
        (int(c), float(s), f.replace(tzinfo=UTC) if f.tzinfo is None else f) for c, s, f in rows
    ]
    return sorted(made, key=lambda row: (row[2], row[0]))


def test_project_page_shows_the_gpu_time_of_each_decision_over_time(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory, stores: Stores
) -> None:
    day = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    made = [
        cycles.make(gpu_seconds=12.0, finished_at=day + timedelta(days=3, hours=2)),
        cycles.make(
            result=stopped_command_result(), gpu_seconds=4.5, finished_at=day + timedelta(days=1)
        ),
        cycles.make(verdict="slower", gpu_seconds=30.25, finished_at=day),
    ]
    with stores.ops_session() as session:  # a cycle whose job failed: GPU time, no decision
        failed = Cycle(
            project_id=ops.get_project(session, "probe-dash").id,
            state="failed",
            experiment="probe",
            gpu_seconds=99.0,
        )
        session.add(failed)
        session.flush()
        session.add(
            Job(
                project_id=failed.project_id,
                cycle_id=failed.id,
                experiment="probe",
                queue="gpu.cpu",
                state="failed",
                gpu_seconds=99.0,
                finished_at=day + timedelta(days=2),
            )
        )
    login(client, tokens["reader"])
    page = client.get("/dashboard/projects/probe-dash").text

    expected = _stored_decisions(stores)
    assert [c for c, _, _ in expected] == [made[2].cycle_id, made[1].cycle_id, made[0].cycle_id]
    shown = ROW.findall(page[page.index('id="gpu-time-table"') :])
    assert [(int(c), when, s) for c, when, s in shown] == [
        (c, f"{when:%Y-%m-%d %H:%M:%S}", f"{s:.2f}") for c, s, when in expected
    ]
    seconds = [s for _, s, _ in expected]
    summary = re.sub(r"<[^>]+>", "", page[page.index('id="gpu-time-summary"') :]).split("</p>")[0]
    assert (
        f"{len(seconds)} decisions took {sum(seconds):.2f} GPU s in all, a median of "
        f"{statistics.median(seconds):.2f} GPU s each." in summary
    )
    # Where a stopping rule stopped the blocks, the table says how many of how many ran.
    stopped = page[page.index(f'<tr data-cycle="{made[1].cycle_id}">') :].split("</tr>")[0]
    assert ">3 / 12<" in stopped
    # The chart: one marker per decision on one line per experiment, dated from the first.
    chart = page[page.index('<figure class="chart" id="gpu-time">') :].split("</figure>")[0]
    assert chart.count("<circle") == len(expected) and chart.count("<polyline") == 2
    assert "GPU time per decision" in chart and ">probe<" in chart and ">train<" in chart
    assert "days since the first decision (2026-03-02 09:00 UTC)" in chart
    assert " style=" not in chart and "<script" not in chart
