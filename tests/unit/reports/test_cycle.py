"""REPORT.md and plot.svg from a harness result: what a reviewer reads, rendered the same twice."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

from app.errors import InvalidInput
from app.reports.cycle import ReportContext, render_markdown, render_plot
from tests.integration.forge.gitrepo import harness_result
from tests.unit.reports.report_files import write_report

CONTEXT = ReportContext(
    cycle_id="c0ffee01",
    project="spectral",
    hypothesis="Fusing the two FFT passes halves the time",
    changes="kernel.py fuses the passes",
    lessons=["Fusion pays off above n=128 on CPU"],
    reproduce="autopilot cycle rerun c0ffee01",
    base_sha="a" * 40,
)


def test_report_files(tmp_path: Path) -> None:
    files = write_report(tmp_path, harness_result(), CONTEXT)
    assert files.relative(tmp_path) == [
        "results/c0ffee01/result.json",
        "results/c0ffee01/REPORT.md",
        "results/c0ffee01/plot.svg",
    ]
    assert json.loads(files.result.read_text())["verdict"] == "faster"
    text = files.report.read_text()
    for expected in (
        "# Fusing the two FFT passes",
        "**Verdict: faster**",
        "| fused | 1.01 µs |",
        "0.8 | 0.78 | 0.82 | faster | pass, max rel. error 1e-07",
        "- Fusion pays off above n=128",
        "autopilot cycle rerun c0ffee01",
        "- torch: `2.4.0`",
        "`n=256`",
        "## Hypothesis",
        "## What changed",
    ):
        assert expected in text, expected
    svg = files.plot.read_text()
    ElementTree.fromstring(svg)  # well-formed
    for label in (
        "baseline time per call (µs)",
        "variant time per call (µs)",
        "threads (count)",
        "throughput (calls/s)",
    ):
        assert label in svg, label
    before = [p.read_bytes() for p in (files.result, files.report, files.plot)]
    write_report(tmp_path, harness_result(), CONTEXT)
    assert [p.read_bytes() for p in (files.result, files.report, files.plot)] == before


def test_sparse_and_error_results_still_render() -> None:
    text = render_markdown(
        {"verdict": "inconclusive", "ratio": 0.99, "ci_low": 0.97, "ci_high": 1.01}, CONTEXT
    )
    assert "inconclusive" in text and "0.97" in text
    failed = render_markdown({"status": "error", "error": {"message": "CUDA OOM | x"}}, CONTEXT)
    assert "**Verdict: error**" in failed and "CUDA OOM \\| x" in failed
    assert "no samples" in render_plot({})


@pytest.mark.parametrize("cycle", ["../x", "a/b", "-x", ""])
def test_bad_cycle_dir(tmp_path: Path, cycle: str) -> None:
    with pytest.raises(InvalidInput):
        write_report(tmp_path, {}, ReportContext(cycle_id=cycle, project="p", hypothesis="h"))


def test_report_warns_where_the_self_report_disagrees_with_the_judgement() -> None:
    line = (
        "The experiment reported `faster` for fused; the control plane computed "
        "`inconclusive` from its samples."
    )
    judged = {
        **harness_result(),
        "judgement": {"by": "control-plane", "disagreements": [line], "not_judged": ["factorial"]},
    }
    text = render_markdown(judged, CONTEXT)
    assert "computed by the control plane" in text
    assert "> [!WARNING]" in text and f"> - {line}" in text
    assert "Not judged (as the experiment reported them): `factorial`." in text
    assert text.index("[!WARNING]") < text.index("## Hypothesis")
    honest = {**harness_result(), "judgement": {"by": "control-plane", "disagreements": []}}
    assert "[!WARNING]" not in render_markdown(honest, CONTEXT)
    assert "control plane" not in render_markdown(harness_result(), CONTEXT)


def test_report_says_when_the_experiment_ran_unconfined() -> None:
    judged = {**harness_result(), "judgement": {"by": "control-plane", "disagreements": []}}
    assert "unconfined" not in render_markdown({**judged, "sandbox": "on"}, CONTEXT)
    text = render_markdown({**judged, "sandbox": "off"}, CONTEXT)
    assert "> [!CAUTION]" in text and "AUTOPILOT_SANDBOX=off" in text
