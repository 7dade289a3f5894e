"""A cycle's review page in a real browser, at 1280 x 800: what a reviewer decides from (the
verdict, the headline ratio with its interval, where each number came from, where the blocks
stopped, the diff and the decision form) is on the first screen, each fact of the comparison is
on the page once, and the whole report is one click away.

The cycles are made as the commit and publish steps leave them (the results judged by the
control plane's own judge, the report committed, the pull request's body written as Publish
writes it): one harness comparison, and one command comparison whose blocks a sequential rule
stopped early. Screenshots go to test-artifacts/screenshots/review-*.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.projects import service as ops
from tests.e2e.conftest import LiveServer
from tests.integration.dashboard.conftest import (
    CycleFactory,
    Made,
    harness_judged_result,
    stopped_command_result,
)

SCREEN = {"width": 1280, "height": 800}
HYPOTHESIS = "Fusing the two passes into one loop halves the memory traffic"


def _sign_in(page: Any, base: str, token: str, next_path: str) -> None:
    page.goto(f"{base}{next_path}")
    page.get_by_label("API token").fill(token)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}{next_path}")


def _on_first_screen(page: Any, selector: str) -> bool:
    box = page.locator(selector).first.bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= SCREEN["height"]


def _review(page: Any, base: str, made: Made, name: str, screenshots: Path) -> int:
    """The cycle's review page checked at SCREEN; returns its height in CSS pixels."""
    page.goto(f"{base}/dashboard/cycles/{made.cycle_id}")
    page.wait_for_function(
        "() => [...document.querySelectorAll('img.plot')].every(i => i.complete && i.naturalWidth)"
    )
    page.screenshot(path=str(screenshots / f"review-{name}-first-screen.png"))
    page.screenshot(path=str(screenshots / f"review-{name}.png"), full_page=True)
    # What a reviewer decides from is on the first screen, without scrolling.
    for what in ("main > h1", "#headline-ratio", "#sources", "#gate", "details.diff > summary"):
        assert _on_first_screen(page, what), what
    for button in ("Approve", "Reject"):
        assert _on_first_screen(page, f"#decision button:has-text('{button}')"), button
    # Each fact of the comparison once: the hypothesis, the results table, the plot.
    html = page.content()
    assert html.count(HYPOTHESIS) == 1
    assert page.locator("main table").count() == 2  # the results, and the environment's
    assert page.locator("#results table").count() == 1
    assert page.locator("img.plot").count() == 1 and "<svg" not in html
    assert page.locator("h2", has_text="Environment").count() == 0  # once, folded
    assert page.locator("details.environment").count() == 1
    return int(page.evaluate("document.documentElement.scrollHeight"))


def test_review_page_shows_each_fact_once_with_the_decision_on_the_first_screen(
    browser: Any, live_server: LiveServer, screenshots: Path, tmp_path: Path
) -> None:
    base = live_server.url
    factory = CycleFactory(live_server.settings, live_server.stores, tmp_path / "repos")
    harness = factory.make(result=harness_judged_result(), published=True, hypothesis=HYPOTHESIS)
    result = stopped_command_result()
    stopped = factory.make(result=result, published=True, hypothesis=HYPOTHESIS, gpu_seconds=20.5)
    with live_server.stores.ops_session() as session:
        _, reviewer = ops.create_token(session, "reviewer", ["review"])

    context = browser.new_context(viewport=SCREEN)
    page = context.new_page()
    _sign_in(page, base, reviewer, f"/dashboard/cycles/{harness.cycle_id}")
    heights = {
        name: _review(page, base, made, name, screenshots)
        for name, made in (("harness", harness), ("stopped", stopped))
    }
    print(f"review page heights at {SCREEN['width']}x{SCREEN['height']}: {heights}")  # noqa: T201
    # With each fact two or three times over, these pages were 4,611 (harness) and 5,970 px
    # (command) tall; about 2,100 now, a third of it the plot.
    assert all(height <= 3 * SCREEN["height"] for height in heights.values()), heights

    # Where the numbers came from, and where the blocks stopped: the runner's clock for the
    # metric, the base commit's evaluator for the check; 3 of at most 12 blocks, 9 not run,
    # at the median run's time for each of their 3 runs.
    sources = page.locator("#sources").inner_text()
    assert "run_s: runner clock" in sources and "val_loss: evaluator at the base commit" in sources
    durations = sorted(run["duration_s"] for run in result["runs"])
    saved = 3 * 9 * durations[len(durations) // 2]
    stop = page.locator("#stop").inner_text()
    assert stop.startswith("Blocks: 3 of at most 12, decided: the difference crossed")
    assert f"9 blocks not run saved about {saved:.3g} GPU s" in stop, (stop, saved)
    assert "repeated 95% interval" in page.locator("#verdict").inner_text()
    assert page.locator("#gpu-time").inner_text() == "20.5"

    # The whole report is one click away, and says the same.
    page.get_by_role("link", name="The whole report").click()
    page.wait_for_url(f"{base}/dashboard/cycles/{stopped.cycle_id}/report")
    report = page.locator("article.report")
    assert report.locator("h2", has_text="Hypothesis").count() == 1
    assert stop in report.inner_text()
    assert page.locator("details.pr-body-wrap").count() == 1  # the local PR's description
    page.screenshot(path=str(screenshots / "review-stopped-report.png"), full_page=True)
    context.close()
