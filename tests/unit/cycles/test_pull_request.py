"""The pull request body stands alone: what a reviewer on GitHub reads without the dashboard,
written from the same report functions as REPORT.md, and rendered as Markdown."""

from __future__ import annotations

import copy
from html.parser import HTMLParser
from typing import Any

from markdown_it import MarkdownIt

from app.cycles.models import Cycle
from app.cycles.pull_request import MAX_BODY_CHARS, Links, pr_body
from app.forge.base import ProjectRef
from tests.integration.forge.pr_cycles import COMMIT, DASHBOARD, command_cycle, harness_cycle

PROJECT = ProjectRef("spectral", "https://github.example/lab/research.git")


def github_links(cycle: Cycle) -> Links:
    blob = f"https://github.example/lab/research/blob/{COMMIT}/results/{cycle.id}"
    page = f"{DASHBOARD}/cycles/{cycle.id}"
    return Links(
        plot=f"{blob}/plot.svg?raw=true",
        report=f"{blob}/REPORT.md",
        dashboard=page,
        findings=f"{page}#own-h",
        memory=f"{DASHBOARD}/memory?project=spectral",
    )


class Tags(HTMLParser):
    """The start tags of rendered HTML, with their attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def render(body: str) -> Tags:
    """The body as GitHub-flavoured Markdown renders it (CommonMark with tables)."""
    tags = Tags()
    tags.feed(MarkdownIt("commonmark").enable("table").render(body))
    return tags


def test_harness_body_has_verdict_gate_table_plot_and_reproduce() -> None:
    cycle, result = harness_cycle()
    body = pr_body(cycle, PROJECT, result, github_links(cycle))
    for expected in (
        "**Verdict: faster**, ratio 0.800 [0.780, 0.820] (candidate / baseline, 95% bootstrap "
        "CI; A/A noise floor 0.02)",
        "Accuracy gate: **pass** (1 of 1 variants within tolerance).",
        "| variant | baseline median | variant median | ratio (B/A) |",
        "| fused | 1.01 µs | 0.8095 µs | 0.8 | 0.78 | 0.82 | faster | pass, max rel. error 1e-07 |",
        f"![paired samples](https://github.example/lab/research/blob/{COMMIT}/results/41/"
        "plot.svg?raw=true)",
        "## Hypothesis\n\nFusing the two FFT passes halves the time",
        "## What changed\n\nkernel.py fuses the passes into one loop",
        "Parameters: `n=256`",
        "- torch: `2.4.0`",
        "autopilot job submit --project spectral --experiment matmul --param n=256",
        f"[dashboard]({DASHBOARD}/cycles/41)",
        f"[the findings it proposes]({DASHBOARD}/cycles/41#own-h)",
        f"[the whole report, REPORT.md](https://github.example/lab/research/blob/{COMMIT}/"
        "results/41/REPORT.md)",
        "results commit `cccccccccccc`",
    ):
        assert expected in body, expected


def test_command_body_has_check_gate_arms_and_each_arm_by_hand() -> None:
    cycle, result = command_cycle()
    body = pr_body(cycle, PROJECT, result, github_links(cycle))
    for expected in (
        "**Verdict: slower**, ratio 1.980 [1.930, 2.040]",
        "Check gate `val_loss` (lower is better, tolerance 2%): **pass**",
        "| arm | commit | parameters | runs | median step_ms |",
        "| candidate | `d4e5f6a7b8c9` | width=32 | 5 |",
        "![runs per arm and per-block ratios](https://github.example/lab/research/blob/",
        "git checkout a1b2c3d4e5f6",
        "python train.py --width=32 '--name=it'\"'\"'s wide'",
        "autopilot job submit --project spectral --experiment train --param width=32",
        "## Environment",
    ):
        assert expected in body, expected
    assert "### Runs" not in body  # each run's row is REPORT.md's, not the PR's


def test_body_renders_a_table_and_the_plot_image() -> None:
    for cycle, result in (harness_cycle(), command_cycle()):
        where = github_links(cycle)
        tags = render(pr_body(cycle, PROJECT, result, where))
        names = [tag for tag, _ in tags.tags]
        assert "table" in names and names.count("th") >= 7
        images = [attrs for tag, attrs in tags.tags if tag == "img"]
        assert [i["src"] for i in images] == [where.plot]
        hrefs = {attrs.get("href") for tag, attrs in tags.tags if tag == "a"}
        assert {where.dashboard, where.findings, where.report, where.memory} <= hrefs


def many_variants(count: int) -> dict[str, Any]:
    _, result = harness_cycle()
    row = result["comparisons"][0]
    result["comparisons"] = [{**row, "variant": f"variant-{i:05d}"} for i in range(count)]
    return result


def test_a_table_too_long_for_github_is_cut_with_a_note() -> None:
    cycle, _ = harness_cycle()
    result = many_variants(3000)
    body = pr_body(cycle, PROJECT, result, github_links(cycle))
    assert len(body) <= MAX_BODY_CHARS
    shown = body.count("| variant-")
    assert 100 < shown < 3000
    assert f"{3000 - shown} more rows are not shown" in body
    # What follows the table is all still there.
    assert "## Reproduce" in body and "autopilot job submit" in body
    tags = [tag for tag, _ in render(body).tags]
    assert "table" in tags and "img" in tags


def test_a_small_table_is_left_whole() -> None:
    cycle, _ = harness_cycle()
    body = pr_body(cycle, PROJECT, many_variants(40), github_links(cycle))
    assert body.count("| variant-") == 40 and "more rows are not shown" not in body


def test_an_overlong_hypothesis_is_cut_and_credentials_never_reach_the_body() -> None:
    cycle, result = harness_cycle()
    cycle.hypothesis = "push to https://x-access-token:ghp_SECRET123@github.com/lab/r " * 5000
    body = pr_body(cycle, PROJECT, result, github_links(cycle))
    assert len(body) <= MAX_BODY_CHARS
    assert "ghp_SECRET123" not in body
    assert "cut here; REPORT.md has it all" in body and "| fused |" in body


def test_a_body_still_too_long_is_cut_at_the_limit_with_the_verdict_kept() -> None:
    cycle, result = harness_cycle()
    where = github_links(cycle)
    body = pr_body(cycle, PROJECT, result, where, limit=800)
    assert len(body) <= 800
    assert body.startswith("**Verdict: faster**, ratio 0.800 [0.780, 0.820]")
    assert body.endswith(
        f"(cut at 800 characters; the whole report is in REPORT.md: {where.report})\n"
    )


def test_a_comparison_stopped_by_the_rule_names_its_interval_not_a_bootstrap_ci() -> None:
    """A sequential verdict's interval is the stopping rule's (valid however often it looked):
    the PR and REPORT.md must not call it a fixed design's bootstrap CI."""
    from app.cycles.headline import headline
    from app.cycles.pull_request import report_context
    from app.reports.cycle import render_markdown

    fixed_cycle, fixed = command_cycle()
    assert "95% bootstrap CI" in pr_body(fixed_cycle, PROJECT, fixed, github_links(fixed_cycle))

    result = copy.deepcopy(fixed)
    result["stopped"] = {
        "blocks": 5,
        "decision": "effect",
        "blocks_saved": 7,
        "rule": {"max_blocks": 12},
    }
    result["headline"] = {**result.get("headline", {}), "kind": "command", "stopped": {"blocks": 5}}
    cycle = fixed_cycle
    cycle.headline = headline(result)
    body = pr_body(cycle, PROJECT, result, github_links(cycle))
    assert "(candidate / baseline, the stopping rule's repeated 95% interval" in body
    assert "bootstrap" not in body
    report = render_markdown(result, report_context(cycle, PROJECT))
    assert "(the stopping rule's repeated 95% interval, valid however often it looked)" in report
    assert "Blocks: 5 of at most 12, decided" in report
    assert "with the stopping rule's repeated 95% interval (the blocks stopped when" in report
    assert "bootstrap" not in report
