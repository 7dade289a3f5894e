"""The project pages over HTML: the list, a project without cycles (no empty chart), and one
with cycles (inline charts whose points link to the cycles, best so far, budgets, validated
findings), live like the cycle pages."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.db import Stores
from app.memory import service as memory
from app.projects import service as ops
from tests.integration.dashboard.conftest import CycleFactory, login


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
