"""Command experiments: the keys of `autopilot.toml`, placeholders, metric reading and the arms'
schedule (app/projects/command.py, config.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from app.projects import command
from app.projects.config import ConfigError, parse

BASE = """
[project]
name = "tiny"

[experiments.train]
kind = "command"
command = ["python", "train.py", "--width={width}", "--device={device}"]
metric = "step_ms"
metric_pattern = 'time (?P<value>[0-9.]+)ms'
aggregate = "median"
repeats = 4
{extra}

[experiments.train.parameters]
width = [16, 32]

[experiments.train.defaults]
width = 16
"""


def config(extra: str = "", **replace: str) -> str:
    text = BASE.replace("{extra}", extra)
    for old, new in replace.items():
        text = text.replace(old, new)
    return text


def error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    return str(caught.value.detail)


def test_a_command_experiment_parses_with_its_defaults() -> None:
    exp = parse(config()).experiment("train")
    assert exp.kind == "command" and exp.entry is None
    assert exp.repeats == 4 and exp.warmup_runs == 0 and exp.aggregate == "median"
    assert exp.time_metric  # step_ms: a time, so the verdict says faster/slower
    assert exp.check_pattern is None and exp.check_tolerance == 0.02


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            config(**{"'time (?P<value>[0-9.]+)ms'": "'time ([0-9.]+)ms'"}),
            "key 'experiments.train': metric_pattern 'time ([0-9.]+)ms' has no named group `value`",
        ),
        (
            config(**{"--width={width}": "--depth={depth}"}),
            "command placeholder {depth} is not a declared parameter; declared: width",
        ),
        (
            config(
                **{
                    '["python", "train.py", "--width={width}", "--device={device}"]': '"python train.py"'
                }
            ),
            "key 'experiments.train.command': 'python train.py' is not an argv",
        ),
        (
            config(**{"metric_pattern = 'time (?P<value>[0-9.]+)ms'": ""}),
            "with `metric_pattern` (a regex with a `value` group) or with `metric_file` and "
            "`metric_key`: exactly one",
        ),
        (config('metric_file = "out.json"'), "exactly one of the two"),
        (config(**{"--width={width}": "--width={width"}), "unmatched brace"),
        (config('setup = ["python", "prep.py", "--width={width}"]'), "takes only {device}"),
        (config('entry = "bench.main"'), "`entry` is for kind = 'harness'"),
        (config(**{"[experiments.train.defaults]\nwidth = 16": ""}), "has no default"),
        (config(**{"(?P<value>[0-9.]+": "(?P<value>[0-9.+"}), "is not a regular expression"),
    ],
)
def test_a_bad_declaration_names_the_key_and_the_expected_form(text: str, expected: str) -> None:
    assert expected in error(text)


def test_a_harness_experiment_needs_its_entry_and_takes_no_command_keys() -> None:
    harness = '[project]\nname = "h"\n[experiments.e]\nmetric = "ratio"\n'
    assert "needs `entry`" in error(harness)
    assert "`command` is for kind = 'command'" in error(
        harness + 'entry = "a.b"\ncommand = ["python", "x.py"]\n'
    )


def test_placeholders_are_filled_and_braces_escape() -> None:
    argv = ["python", "t.py", "--w={width}", "--dev={device}", "{{literal}}", "--on={flag}"]
    assert command.placeholders(argv) == ["width", "device", "flag"]
    assert command.render(argv, {"width": 32, "flag": True}, "cuda:0") == [
        "python",
        "t.py",
        "--w=32",
        "--dev=cuda:0",
        "{literal}",
        "--on=true",
    ]
    with pytest.raises(command.CommandError, match=r"placeholder \{flag\} has no parameter"):
        command.render(argv, {"width": 32}, "cpu")
    assert command.device_name("cpu") == "cpu" and command.device_name("cuda") == "cuda:0"


@pytest.mark.parametrize(
    ("how", "expected"), [("last", 3.0), ("median", 2.0), ("mean", 2.0), ("min", 1.0), ("max", 3.0)]
)
def test_the_metric_is_aggregated_over_stdout_then_stderr(how: str, expected: float) -> None:
    pattern = command.check_pattern(r"time (?P<value>[0-9.]+)ms", "metric_pattern")
    out = "step 1 time 1.0ms\nnoise\nstep 2 time 2.0ms\n"
    err = "step 3 time 3.0ms\n"
    assert command.read_pattern((out, err), pattern, how, "metric_pattern") == expected  # type: ignore[arg-type]


def test_a_pattern_that_never_matches_or_matches_no_number_is_an_error() -> None:
    pattern = command.check_pattern(r"loss (?P<value>\S+)", "check_pattern")
    with pytest.raises(command.CommandError, match="never matched the run's output"):
        command.read_pattern(("nothing here",), pattern, "last", "check_pattern")
    with pytest.raises(command.CommandError, match="matched 'nan!', which is not a number"):
        command.read_pattern(("loss nan!",), pattern, "last", "check_pattern")
    with pytest.raises(command.CommandError, match="not a finite number"):
        command.read_pattern(("loss inf",), pattern, "last", "check_pattern")


def test_a_metric_file_key_is_read_dotted() -> None:
    data = b'{"eval": {"loss": 0.25}, "steps": "300"}'
    assert command.read_json_key(data, "eval.loss", "metric_file") == 0.25
    assert command.read_json_key(data, "steps", "metric_file") == 300.0
    with pytest.raises(command.CommandError, match="has no key 'eval.acc'"):
        command.read_json_key(data, "eval.acc", "metric_file")
    with pytest.raises(command.CommandError, match="not valid JSON"):
        command.read_json_key(b"{", "x", "metric_file")


def test_the_schedule_interleaves_blocks_of_three_in_a_seeded_order() -> None:
    runs = command.schedule(repeats=6, warmup_runs=1, seed=3)
    assert [r.role for r in runs[:2]] == ["warmup", "warmup"]
    assert {r.arm for r in runs[:2]} == {"baseline", "candidate"}
    blocks = [runs[2 + 3 * b : 5 + 3 * b] for b in range(6)]
    for b, block in enumerate(blocks):
        assert {r.block for r in block} == {b}
        assert Counter(r.role for r in block) == {"baseline": 1, "candidate": 1, "baseline_aa": 1}
        assert all((r.arm == "candidate") == (r.role == "candidate") for r in block)
    orders = {tuple(r.role for r in block) for block in blocks}
    assert len(orders) > 1  # randomised, not one fixed order
    assert [r.index for r in runs] == list(range(len(runs)))
    assert command.schedule(6, 1, 3) == runs  # the seed fixes it
    assert command.schedule(6, 1, 4) != runs


def test_time_metrics_are_told_from_their_names_or_unit() -> None:
    assert command.is_time_metric("iter_ms") and command.is_time_metric("latency")
    assert command.is_time_metric("step_time") and command.is_time_metric("epoch_seconds")
    assert not command.is_time_metric("val_bpb") and not command.is_time_metric("loss")
    assert not command.is_time_metric("tokens_per_s")  # a rate
    assert command.is_time_metric("val_bpb", "time") and not command.is_time_metric(
        "iter_ms", "other"
    )
