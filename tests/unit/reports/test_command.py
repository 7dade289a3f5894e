"""REPORT.md and plot.svg of a command experiment: the lab's own script run in interleaved blocks,
baseline arm against candidate arm, rendered from the judged result."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from markdown_it import MarkdownIt

from app.reports.command import block_ratios
from app.reports.cycle import ReportContext, render_markdown, render_plot
from tests.integration.forge.gitrepo import harness_result
from tests.unit.reports.report_files import write_report

BASE = "a1b2c3d4e5f6" + "0" * 28
HEAD = "d4e5f6a7b8c9" + "1" * 28
BASELINE_ARGV = ["python", "train.py", "--width=16", "--device=cpu"]
CANDIDATE_ARGV = ["python", "train.py", "--width=32", "--name=it's wide"]
CONTEXT = ReportContext(
    cycle_id="42",
    project="lab",
    hypothesis="Wider layers make a step slower",
    changes="width 16 -> 32",
    reproduce="autopilot job submit --project lab --experiment train --param width=32",
    base_sha=BASE,
)


def run(index: int, block: int | None, arm: str, role: str, value: float) -> dict[str, Any]:
    return {
        "index": index,
        "block": block,
        "arm": arm,
        "role": role,
        "value": value,
        "check": 0.050 if arm == "baseline" else 0.049,
        "exit_code": 0,
        "duration_s": 0.8 if arm == "candidate" else 0.4,
        "log": f"runs/{index:03d}-{arm}.log",
    }


def command_result(blocks: int = 5) -> dict[str, Any]:
    """A judged command result: one warm-up run per arm, then blocks of (candidate, baseline,
    baseline A/A), the candidate about twice as slow, the check gate passing."""
    runs = [run(0, None, "baseline", "warmup", 1.25), run(1, None, "candidate", "warmup", 2.5)]
    samples: dict[str, list[float]] = {"baseline": [], "candidate": [], "baseline_aa": []}
    for block in range(blocks):
        for offset, arm, role, value in (
            (0, "candidate", "candidate", 2.40 + 0.01 * block),
            (1, "baseline", "baseline", 1.20 + 0.005 * block),
            (2, "baseline", "baseline_aa", 1.22 - 0.004 * block),
        ):
            runs.append(run(2 + 3 * block + offset, block, arm, role, round(value, 4)))
            samples[role].append(round(value, 4))
    return {
        "status": "ok",
        "kind": "command",
        "experiment": "train",
        "metric": "step_ms",
        "direction": "lower",
        "time_metric": True,
        "device": "cpu",
        "repeats": blocks,
        "warmup_runs": 1,
        "sandbox": "on",
        "arms": {
            "baseline": {"commit": BASE, "parameters": {"width": 16}, "command": BASELINE_ARGV},
            "candidate": {"commit": HEAD, "parameters": {"width": 32}, "command": CANDIDATE_ARGV},
        },
        "runs": runs,
        "samples": samples,
        "checks": {
            "metric": "val_loss",
            "baseline": [0.050] * blocks,
            "candidate": [0.049] * blocks,
        },
        "ratio": 1.98,
        "ci_low": 1.93,
        "ci_high": 2.04,
        "verdict": "slower",
        "noise_floor": {"ratio": 1.01, "ci_low": 0.99, "ci_high": 1.03, "n": blocks, "floor": 0.03},
        "check": {
            "metric": "val_loss",
            "direction": "lower",
            "tolerance": 0.02,
            "baseline": 0.050,
            "candidate": 0.049,
            "pass": True,
            "reason": None,
        },
        "headline": {
            "metric": "step_ms",
            "variant": "candidate",
            "baseline": "baseline",
            "ratio": 1.98,
            "ci_low": 1.93,
            "ci_high": 2.04,
            "verdict": "slower",
            "noise_floor": 0.03,
            "accuracy_pass": True,
        },
        "judgement": {
            "by": "control-plane",
            "seed": 0,
            "self_reported": {},
            "disagreements": [],
            "not_judged": [],
        },
    }


def section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same level."""
    level = heading.split(" ")[0] + " "
    body = text.split(heading + "\n", 1)[1]
    ends = [i for i in (body.find("\n" + level),) if i >= 0]
    return body[: ends[0]] if ends else body


def test_command_report_has_the_ratio_gate_arms_and_runs() -> None:
    text = render_markdown(command_result(), CONTEXT)
    assert "**Verdict: slower**" in text
    results = section(text, "## Results")
    for expected in (
        "Ratio candidate/baseline of `step_ms`: **1.980 [1.930, 2.040]** (95% bootstrap CI).",
        "A/A noise floor: 0.03 (A/A ratio 1.010 [0.990, 1.030], 5 blocks).",
        "Check gate `val_loss` (lower is better, tolerance 2%): **pass**; "
        "baseline median 0.05, candidate median 0.049.",
        "| arm | commit | parameters | runs | median step_ms | min | max | median val_loss |",
        "| baseline | `a1b2c3d4e5f6` | width=16 | 5 | 1.21 | 1.2 | 1.22 | 0.05 |",
        "| baseline A/A | `a1b2c3d4e5f6` | width=16 | 5 | 1.212 | 1.204 | 1.22 | 0.05 |",
        "| candidate | `d4e5f6a7b8c9` | width=32 | 5 | 2.42 | 2.4 | 2.44 | 0.049 |",
        "| run | block | arm | role | step_ms | val_loss | exit | duration (s) | log |",
        "| 0 | – | baseline | warmup | 1.25 | 0.05 | 0 | 0.4 | `runs/000-baseline.log` |",
        "| 2 | 0 | candidate | candidate | 2.4 | 0.049 | 0 | 0.8 | `runs/002-candidate.log` |",
        "| 4 | 0 | baseline | baseline_aa | 1.22 | 0.05 | 0 | 0.4 | `runs/004-baseline.log` |",
        "| 16 | 4 | baseline | baseline_aa | 1.204 | 0.05 | 0 | 0.4 | `runs/016-baseline.log` |",
        "![runs per arm and per-block ratios](plot.svg)",
    ):
        assert expected in results, expected
    assert results.index("### Arms") < results.index("### Runs")
    method = section(text, "## Method")
    assert "5 interleaved blocks after 2 warm-up runs (not judged)" in method
    assert "the check gate on `val_loss` is applied before" in method
    commands = f"# baseline at {BASE[:12]}\n{shlex.join(BASELINE_ARGV)}\n"
    assert commands in method
    assert f"# candidate at {HEAD[:12]}\n{shlex.join(CANDIDATE_ARGV)}\n" in method
    # Both tables are tables to a Markdown renderer: every row has the header's cells.
    html = MarkdownIt("commonmark").enable("table").render(text)
    assert html.count("<table>") == 2
    assert html.count("<tr>") == (1 + 3) + (1 + 2 + 15)
    assert "paired samples" not in text and "| variant |" not in text


def test_reproduce_checks_out_each_arm_and_runs_its_quoted_command() -> None:
    reproduce = section(render_markdown(command_result(), CONTEXT), "## Reproduce")
    assert f"git checkout {BASE}\npython train.py --width=16 --device=cpu\n" in reproduce
    quoted = "python train.py --width=32 '--name=it'\"'\"'s wide'"
    assert quoted == shlex.join(CANDIDATE_ARGV)
    assert f"git checkout {HEAD}\n{quoted}\n" in reproduce
    assert shlex.split(quoted) == CANDIDATE_ARGV
    assert reproduce.index("# baseline") < reproduce.index("# candidate")
    assert reproduce.rstrip().endswith(f"```sh\n{CONTEXT.reproduce}\n```")


def test_reproduce_never_pastes_what_is_not_a_commit_or_ends_the_block_early() -> None:
    result = command_result()
    result["arms"]["candidate"] = {
        "commit": "main\nrm -rf ~",
        "parameters": {"name": "a|b"},
        "command": ["python", "x.py", "--tag=```\necho hi"],
    }
    text = render_markdown(result, CONTEXT)
    reproduce = section(text, "## Reproduce")
    assert "rm -rf" not in text and "git checkout main" not in reproduce
    assert "````sh" in reproduce  # a fence longer than the backticks inside
    assert "| candidate | – | name=a\\|b | 5 |" in text


def test_failing_check_gate_says_why() -> None:
    result = command_result()
    reason = "candidate val_loss 0.061 is worse than the baseline's 0.050 beyond the 2% tolerance"
    result["check"] = {**result["check"], "candidate": 0.061, "pass": False, "reason": reason}
    result["verdict"] = result["headline"]["verdict"] = "rejected_accuracy"
    text = render_markdown(result, CONTEXT)
    assert "**Verdict: rejected_accuracy**" in text
    assert (
        "Check gate `val_loss` (lower is better, tolerance 2%): **fail**; "
        f"baseline median 0.05, candidate median 0.061: {reason}."
    ) in text


def test_without_a_check_gate_the_report_says_so() -> None:
    result = command_result()
    del result["check"], result["checks"]
    for run_ in result["runs"]:
        run_["check"] = None
    result["metric"], result["direction"], result["verdict"] = "accuracy", "higher", "better"
    text = render_markdown(result, CONTEXT)
    assert "**Verdict: better**" in text
    assert "No check gate: the experiment declares none, so only `accuracy` is judged." in text
    assert "| arm | commit | parameters | runs | median accuracy | min | max |\n" in text
    assert "| 2 | 0 | candidate | candidate | 2.4 | – | 0 |" in text
    assert "(higher is better)" in text


def test_runs_stand_in_for_missing_samples() -> None:
    result = command_result()
    with_samples = section(render_markdown(result, CONTEXT), "### Arms")
    del result["samples"], result["checks"]
    assert section(render_markdown(result, CONTEXT), "### Arms") == with_samples


def test_block_ratios_pair_each_block_and_skip_a_missing_run() -> None:
    result = command_result(blocks=3)
    result["samples"]["candidate"][1] = None
    ratios = block_ratios(result)
    assert [b for b, _ in ratios["candidate / baseline"]] == [0, 2]
    assert ratios["candidate / baseline"][0][1] == 2.40 / 1.20
    assert [b for b, _ in ratios["A/A (baseline / baseline)"]] == [0, 1, 2]


def test_command_plot_shows_the_metric_per_arm_and_the_block_ratios(tmp_path: Path) -> None:
    files = write_report(tmp_path, command_result(), CONTEXT)
    svg = files.plot.read_text()
    ElementTree.fromstring(svg)  # well-formed
    for label in (
        "step_ms",
        "step_ms per run (lower is better)",
        "baseline A/A",
        "candidate",
        "Per-block ratios",
        "block",
        "ratio",
        "no difference",
    ):
        assert label in svg, label
    assert "Paired samples" not in svg
    assert render_plot(command_result()) == svg  # deterministic
    assert "no runs to plot" in render_plot({"kind": "command"})


def test_unconfined_command_experiment_is_cautioned() -> None:
    text = render_markdown({**command_result(), "sandbox": "off"}, CONTEXT)
    assert "> [!CAUTION]" in text and "AUTOPILOT_SANDBOX=off" in text


def test_a_harness_result_keeps_its_own_rendering() -> None:
    text = render_markdown(harness_result(), CONTEXT)
    assert "![paired samples](plot.svg)" in text and "| variant |" in text
    assert "### Arms" not in text and "Each arm by hand" not in text
    svg = render_plot(harness_result())
    assert "Paired samples" in svg and "Per-block ratios" not in svg
