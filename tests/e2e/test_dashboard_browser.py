"""The review path in a real browser: two real cycles run by real workers reach review; one is
decided from the first screen of its page and approved with the keyboard, the other rejected
with JavaScript off; memory shows the outcome.

Screenshots of every page go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import httpx

from app.cycles.models import Cycle
from app.memory import service as memory
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.e2e.conftest import SCREENSHOTS, LiveServer
from tests.integration.queue.conftest import Workers, make_repo
from tests.support import bearer, wait_for

PROJECT = "probe-dashboard"
PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1366, "height": 900}
SCREEN = {"width": 1280, "height": 800}  # the first screen a reviewer decides from


def _trigger(base: str, token: str, sleep_s: float) -> int:
    response = httpx.post(
        f"{base}/api/v1/cycles",
        headers=bearer(token),
        json={
            "project": PROJECT,
            "experiment": "probe",
            "parameters": {"sleep_s": sleep_s, "grandchild": 0},
        },
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _await_review(server: LiveServer, cycle_id: int, workers: Workers) -> list[str]:
    def ended() -> Cycle | None:
        with server.stores.ops_session() as session:
            cycle = session.get(Cycle, cycle_id)
            assert cycle is not None
            if cycle.state in ("awaiting_review", "failed", "skipped_repeat", "cancelled"):
                session.expunge(cycle)
                return cycle
        return None

    cycle = wait_for(ended, timeout=180, interval=0.1)
    assert cycle.state == "awaiting_review", (cycle.state, cycle.error, workers.logs())
    assert cycle.finding_ids
    return list(cycle.finding_ids)


def _statuses(server: LiveServer, ids: list[str]) -> set[str]:
    with server.stores.memory_session() as session:
        return {memory.get(session, fid).status for fid in ids}


def _sign_in(page: Any, base: str, token: str, next_path: str = "/dashboard/") -> None:
    page.goto(f"{base}{next_path}")
    assert "/dashboard/login" in page.url  # not signed in: sent to the form
    page.get_by_label("API token").fill(token)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}{next_path}")


def _plot_loaded(page: Any) -> None:
    page.wait_for_function(
        "() => { const i = document.querySelector('img.plot');"
        " return i && i.complete && i.naturalWidth > 0; }"
    )


def _decidable_from_the_first_screen(page: Any, server: LiveServer, cycle_id: int) -> None:
    """At 1280 x 800 the verdict's headline, its sources and the decision form show without
    scrolling, and the hypothesis, the results table and the plot are each on the page once."""
    page.set_viewport_size(SCREEN)
    for what in ("main > h1", "#headline-ratio", "#sources"):
        box = page.locator(what).first.bounding_box()
        assert box is not None and box["y"] + box["height"] <= SCREEN["height"], what
    for button in ("approve", "reject"):
        box = page.locator(f'#decision button[value="{button}"]').bounding_box()
        assert box is not None and box["y"] + box["height"] <= SCREEN["height"], button
    with server.stores.ops_session() as session:
        cycle = session.get(Cycle, cycle_id)
        assert cycle is not None and cycle.hypothesis
        hypothesis = html.escape(cycle.hypothesis, quote=False)
    assert page.content().count(hypothesis) == 1
    assert page.locator("#results table").count() == 1 and page.locator("img.plot").count() == 1
    page.screenshot(path=str(SCREENSHOTS / "03-pr-detail-first-screen.png"))
    page.set_viewport_size(LAPTOP)


def test_review_in_the_browser_approve_and_reject(
    browser: Any, workers: Workers, live_server: LiveServer, screenshots: Path, tmp_path: Path
) -> None:
    base = live_server.url
    repo = make_repo(tmp_path, PROJECT)
    with live_server.stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=PROJECT, repo_url=str(repo)))
        _, trigger = ops.create_token(session, "ci", ["trigger"])
        _, reviewer = ops.create_token(session, "reviewer", ["review"])
    # A reader keeps the (empty) cycles page open while the cycles run: it follows them live.
    watcher = browser.new_context(viewport=LAPTOP).new_page()
    _sign_in(watcher, base, reviewer, "/dashboard/cycles")
    assert "No cycles" in watcher.locator("main").inner_text()
    watcher.evaluate("window.__sameDocument = true")  # gone if the page ever reloads
    # The reader starts changing a filter and leaves it unsent: the page must not swap under it.
    watcher.get_by_label("Project").select_option(PROJECT)
    watcher.locator("h1").click()  # focus leaves the field; the form stays changed

    workers.start("control", "control", "--beat")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    first = _trigger(base, trigger, 0.05)
    second = _trigger(base, trigger, 0.2)  # a different parameter point
    first_findings = _await_review(live_server, first, workers)
    second_findings = _await_review(live_server, second, workers)

    assert "No cycles" in watcher.locator("main").inner_text()  # held while the form changed
    watcher.get_by_label("Project").select_option("")  # back as it was: the update comes in
    watcher.locator("h1").click()
    for cycle_id in (first, second):
        row = watcher.locator("tr", has=watcher.locator(f'a[href="/dashboard/cycles/{cycle_id}"]'))
        row.locator(".badge.s-awaiting_review").wait_for(timeout=30_000)
    assert watcher.evaluate("window.__sameDocument === true")  # updated in place, no reload
    watcher.screenshot(path=str(screenshots / "00-cycles-live.png"), full_page=True)
    watcher.context.close()

    # -- approve the first, with the keyboard ------------------------------------------------
    context = browser.new_context(viewport=LAPTOP)
    page = context.new_page()
    page.goto(f"{base}/")
    page.screenshot(path=str(screenshots / "01-login.png"))
    _sign_in(page, base, reviewer)
    assert page.locator("h1").inner_text() == "Review queue"
    rows = page.locator(f'a.pr-link[href="/dashboard/cycles/{first}"]')
    assert rows.count() == 1
    assert page.locator(f'a.pr-link[href="/dashboard/cycles/{second}"]').count() == 1
    page.screenshot(path=str(screenshots / "02-review-queue.png"), full_page=True)

    rows.click()
    page.wait_for_url(f"{base}/dashboard/cycles/{first}")
    _plot_loaded(page)
    _decidable_from_the_first_screen(page, live_server, first)
    assert page.get_by_role("heading", name="Decision").is_visible()
    page.locator("details", has_text="Diff of the pull request").locator("summary").click()
    assert f"results/{first}/REPORT.md" in page.locator("pre.diff").inner_text()
    page.screenshot(path=str(screenshots / "03-pr-detail.png"), full_page=True)

    page.get_by_label("Note").focus()
    page.keyboard.type("numbers hold on the CPU probe")
    page.keyboard.press("Tab")  # the merge checkbox (left unticked)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.value") == "approve"
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}/dashboard/cycles/{first}?done=approved")
    assert "Decision recorded: approved" in page.locator(".flash.good").inner_text()
    assert page.locator('button[name="decision"]').count() == 0
    page.screenshot(path=str(screenshots / "04-approved.png"), full_page=True)
    assert _statuses(live_server, first_findings) == {"validated"}

    page.get_by_role("link", name="Memory").click()
    page.get_by_label("Status").select_option("validated")
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(f"{base}/dashboard/memory?**")
    verdict = page.locator(f'a[href="/dashboard/memory/{first_findings[0]}"]')
    assert verdict.count() == 1
    assert page.locator(f'a[href="/dashboard/memory/{second_findings[0]}"]').count() == 0
    page.screenshot(path=str(screenshots / "05-memory-validated.png"), full_page=True)
    verdict.click()
    audit = page.locator("ol.audit").inner_text()
    assert "reviewer" in audit and "validated" in audit and "numbers hold" in audit
    page.screenshot(path=str(screenshots / "06-finding.png"), full_page=True)

    page.get_by_role("link", name="Cycles").click()
    assert page.locator(f'a[href="/dashboard/cycles/{second}"]').count() == 1
    page.screenshot(path=str(screenshots / "07-cycles.png"), full_page=True)
    page.get_by_role("link", name="GPU queue").click()
    assert page.locator("code", has_text="gpu.cpu").first.is_visible()
    page.screenshot(path=str(screenshots / "08-gpu-queue.png"), full_page=True)
    context.close()

    # -- reject the second, on a phone with JavaScript off -----------------------------------
    phone = browser.new_context(viewport=PHONE, java_script_enabled=False, is_mobile=True)
    page = phone.new_page()
    _sign_in(page, base, reviewer, f"/dashboard/cycles/{second}")
    page.screenshot(path=str(screenshots / "09-phone-pr-detail.png"), full_page=True)
    width = page.locator("main").bounding_box()
    assert width is not None and width["width"] <= PHONE["width"]
    page.get_by_label("Note").fill("the probe sleeps; <b>nothing</b> was measured")
    page.get_by_role("button", name="Reject").click()
    page.wait_for_url(f"{base}/dashboard/cycles/{second}?done=rejected")
    page.screenshot(path=str(screenshots / "10-phone-rejected.png"), full_page=True)
    assert _statuses(live_server, second_findings) == {"refuted"}

    page.goto(f"{base}/dashboard/memory?status=refuted")
    refuted = page.locator(f'a[href="/dashboard/memory/{second_findings[0]}"]')
    assert refuted.count() == 1
    page.screenshot(path=str(screenshots / "11-phone-memory-refuted.png"), full_page=True)
    refuted.click()
    audit = page.locator("ol.audit").inner_text()
    assert "refuted" in audit and "<b>nothing</b> was measured" in audit  # shown as text
    page.goto(f"{base}/dashboard/")
    page.screenshot(path=str(screenshots / "12-phone-review-queue.png"), full_page=True)
    phone.close()
