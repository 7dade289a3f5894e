"""A project's page in a real browser: twelve real cycles, run by real workers over a 4 x 3
parameter space and judged by the control plane, show as a trend with the best so far, as a
parameter map coloured by verdict and as the GPU time each decision took; a point of the map
leads to its cycle.

Screenshots go to test-artifacts/screenshots/ (project-*.png).
"""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path
from typing import Any

import git
import httpx
from sqlalchemy import select

from app.cycles.models import Cycle
from app.jobs.models import Job
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.e2e.conftest import LiveServer
from tests.integration.queue.conftest import Workers
from tests.support import bearer, wait_for

PROJECT = "tile-sweep"
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
BLOCKS = (16, 32, 64, 128)
UNROLLS = (1, 2, 4)
# What each point's candidate takes against the baseline (1 = the same), and one point whose
# answer is wrong: the control plane judges faster, slower, inconclusive and rejected_accuracy.
FACTOR = {16: 1.3, 32: 1.0, 64: 0.85, 128: 0.7}
WRONG = (128, 4)

EXPERIMENT = '''
"""Raw paired samples whose ratio depends on the parameters (fixed: a re-run judges the same)."""
import json, os

spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))
params = spec["parameters"]
f = FACTOR[params["block"]]
factor = f if f == 1.0 else f * (1 - 0.02 * (params["unroll"] - 1))
a = [1000000 + 997 * (i % 5) for i in range(12)]
# No change: noise either way around 1 (inconclusive); else a steady change.
jitter = [(-1) ** i * 311 if f == 1.0 else 311 * ((3 * i) % 4) for i in range(12)]
b = [int(v * factor) + j for v, j in zip(a, jitter)]
aa = [v + 311 * ((3 * i) % 4) - 400 for i, v in enumerate(a)]
wrong = [params["block"], params["unroll"]] == WRONG
json.dump({"status": "ok", "experiment": spec["experiment"], "parameters": params,
           "noise_floor": {"samples": {"a_ns": a, "b_ns": aa}},
           "comparisons": [{"variant": "tiled", "baseline": "base",
                            "samples": {"a_ns": a, "b_ns": b},
                            "accuracy": {"max_abs_error": 1.0 if wrong else 0.0, "scale": 1.0}}]},
          open(os.environ["AUTOPILOT_RESULT"], "w"))
'''

CONFIG = """
[project]
name = "{name}"
gpu_kind = "cpu"
python_requirements = []

[experiments.tile]
entry = "tile.main"
time_limit_s = 60

[experiments.tile.parameters]
block = [16, 32, 64, 128]
unroll = [1, 2, 4]

[experiments.tile.defaults]
block = 16
unroll = 1
"""


def _repo(root: Path) -> Path:
    repo_dir = root / PROJECT
    (repo_dir / "tile").mkdir(parents=True)
    (repo_dir / "tile" / "__init__.py").write_text("")
    source = f"FACTOR = {FACTOR!r}\nWRONG = {list(WRONG)!r}\n" + textwrap.dedent(EXPERIMENT)
    (repo_dir / "tile" / "main.py").write_text(source)
    (repo_dir / "autopilot.toml").write_text(CONFIG.format(name=PROJECT))
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["tile/__init__.py", "tile/main.py", "autopilot.toml"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("tile project", author=actor, committer=actor)
    return repo_dir


def _settled(server: LiveServer, ids: list[int]) -> list[Cycle] | None:
    with server.stores.ops_session() as session:
        rows = [session.get(Cycle, i) for i in ids]
        if any(c is None or c.state not in ("awaiting_review", "failed") for c in rows):
            return None
        session.expunge_all()
        return [c for c in rows if c is not None]


def _sign_in(page: Any, base: str, token: str, next_path: str) -> None:
    page.goto(f"{base}{next_path}")
    page.get_by_label("API token").fill(token)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}{next_path}")


def test_project_page_shows_trend_and_parameter_map_of_twelve_cycles(
    browser: Any, workers: Workers, live_server: LiveServer, screenshots: Path, tmp_path: Path
) -> None:
    base = live_server.url
    repo = _repo(tmp_path)
    with live_server.stores.ops_session() as session:
        project = ops.create_project(session, ProjectCreate(name=PROJECT, repo_url=str(repo)))
        ops.set_budgets(session, project, gpu_hours_per_day=4.0, concurrent_gpus=1)
        _, trigger = ops.create_token(session, "ci", ["trigger"])
        _, reviewer = ops.create_token(session, "reviewer", ["review"])

    # Before any cycle: the page says so, and draws no empty chart.
    context = browser.new_context(viewport=LAPTOP)
    page = context.new_page()
    _sign_in(page, base, reviewer, f"/dashboard/projects/{PROJECT}")
    assert "No cycles yet for this project" in page.locator("main").inner_text()
    assert page.locator("svg.chart").count() == 0
    page.screenshot(path=str(screenshots / "project-00-no-cycles.png"), full_page=True)

    workers.start("control", "control", "--beat")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    ids: list[int] = []
    for block, unroll in itertools.product(BLOCKS, UNROLLS):
        response = httpx.post(
            f"{base}/api/v1/cycles",
            headers=bearer(trigger),
            json={
                "project": PROJECT,
                "experiment": "tile",
                "parameters": {"block": block, "unroll": unroll},
            },
        )
        assert response.status_code == 201, response.text
        ids.append(int(response.json()["id"]))
    done = wait_for(lambda: _settled(live_server, ids), timeout=600, interval=0.2)
    failed = [(c.id, c.error) for c in done if c.state != "awaiting_review"]
    assert not failed, (failed, workers.logs())
    verdicts = {c.id: c.verdict for c in done}
    assert {"faster", "slower", "inconclusive", "rejected_accuracy"} <= set(verdicts.values())

    # Two improvements are approved: their findings become validated.
    faster = [i for i in ids if verdicts[i] == "faster"]
    for cycle_id in faster[:2]:
        approved = httpx.post(
            f"{base}/api/v1/cycles/{cycle_id}/review",
            headers=bearer(reviewer),
            json={"decision": "approve", "note": "holds on the CPU"},
        )
        assert approved.status_code == 200, approved.text

    # The project list leads to the page.
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Projects").click()
    page.wait_for_url(f"{base}/dashboard/projects")
    page.screenshot(path=str(screenshots / "project-01-list.png"), full_page=True)
    page.get_by_role("link", name=PROJECT).click()
    page.wait_for_url(f"{base}/dashboard/projects/{PROJECT}")

    trend = page.locator("figure#trend svg.chart")
    trend.wait_for()
    assert trend.locator("a").count() >= len(ids)  # a link per cycle (the best's star too)
    # Best so far: the lowest ratio among the cycles judged faster.
    ratios = {c.id: (c.headline or {}).get("ratio") for c in done}
    best = min(faster, key=lambda i: float(ratios[i] or 0))
    assert page.locator("#best a", has_text=f"cycle {best}").count() == 1
    assert f"best tile: cycle {best}" in (trend.text_content() or "")

    space = page.locator("figure.space[data-experiment='tile'] svg.chart")
    links = space.locator("a")
    assert links.count() == len(ids)
    hrefs = {links.nth(i).get_attribute("href") for i in range(links.count())}
    assert hrefs == {f"/dashboard/cycles/{i}" for i in ids}
    assert "block" in (space.text_content() or "") and "unroll" in (space.text_content() or "")
    wrong = ids[list(itertools.product(BLOCKS, UNROLLS)).index(WRONG)]
    assert verdicts[wrong] == "rejected_accuracy"
    label = space.locator(f'a[href="/dashboard/cycles/{wrong}"]').get_attribute("aria-label")
    assert label is not None and "rejected accuracy" in label

    # GPU time per decision: every judged cycle, with the GPU seconds its job's row holds.
    with live_server.stores.ops_session() as session:
        jobs = session.scalars(select(Job).where(Job.cycle_id.in_(ids))).all()
        stored = {int(j.cycle_id or 0): j.gpu_seconds for j in jobs}
    assert len(stored) == len(ids) and all(seconds > 0 for seconds in stored.values())
    page.get_by_text("Each decision's GPU time").click()
    # The table is in a <details> that the page's live refresh may render closed again: read
    # the cells' text from the DOM, not what is drawn.
    rows = page.locator("#gpu-time-table tbody tr")
    shown = {
        int(rows.nth(i).get_attribute("data-cycle") or 0): rows.nth(i).locator("td.gpu-s")
        for i in range(rows.count())
    }
    assert {c: (cell.text_content() or "").strip() for c, cell in shown.items()} == {
        c: f"{seconds:.2f}" for c, seconds in stored.items()
    }
    summary = page.locator("#gpu-time-summary").inner_text()
    assert summary.startswith(f"{len(ids)} decisions took {sum(stored.values()):.2f} GPU s")
    assert page.locator("figure#gpu-time circle").count() == len(ids)

    budgets = page.locator("#budgets").inner_text()  # used / limit, both limits
    assert "/ 4" in budgets and "/ 1" in budgets
    findings = page.locator("section", has=page.locator("#findings-h")).locator("li.finding")
    assert findings.count() >= 2
    page.screenshot(path=str(screenshots / "project-02-page.png"), full_page=True)

    # A point of the map leads to its cycle.
    space.locator(f'a[href="/dashboard/cycles/{wrong}"]').click()
    page.wait_for_url(f"{base}/dashboard/cycles/{wrong}")
    assert "rejected accuracy" in page.locator("main > h1").inner_text()
    page.screenshot(path=str(screenshots / "project-03-cycle-from-map.png"), full_page=True)
    # ... and the cycle page leads back to its project.
    page.locator("dl.facts").get_by_role("link", name=PROJECT).click()
    page.wait_for_url(f"{base}/dashboard/projects/{PROJECT}")
    context.close()

    # On a phone the charts shrink to the screen.
    phone = browser.new_context(viewport=PHONE, is_mobile=True)
    small = phone.new_page()
    _sign_in(small, base, reviewer, f"/dashboard/projects/{PROJECT}")
    box = small.locator("figure#trend svg.chart").bounding_box()
    assert box is not None and box["width"] <= PHONE["width"]
    small.screenshot(path=str(screenshots / "project-04-phone.png"), full_page=True)
    phone.close()
