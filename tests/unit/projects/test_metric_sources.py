"""Where a command experiment's metric comes from (`metric_source`), its hold-out evaluator and
the project's hidden paths, as `autopilot.toml` declares them (app/projects/config.py,
command.py), and what the job's spec carries of them (app/jobs/service.py, `command_spec`)."""

from __future__ import annotations

import pytest

from app.agents import prompt
from app.git import protected
from app.jobs.service import command_spec
from app.projects import command
from app.projects.config import ConfigError, parse

BASE = """
[project]
name = "tiny"
{project}

[experiments.train]
kind = "command"
command = ["python", "train.py", "--width={width}"]
metric = "run_s"
{extra}

[experiments.train.parameters]
width = [16, 32]

[experiments.train.defaults]
width = 16
"""
PATTERN = "metric_pattern = 'time (?P<value>[0-9.]+)ms'"
EVALUATOR = """evaluator = ["python", "holdout/evaluate.py", "--model={artifact}"]
artifacts = ["out/model.json"]
"""


def config(extra: str, project: str = "") -> str:
    return BASE.replace("{extra}", extra).replace("{project}", project)


def error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    return str(caught.value.detail)


def test_output_stays_the_default_so_existing_projects_stay_valid() -> None:
    exp = parse(config(PATTERN)).experiment("train")
    assert exp.metric_source == "output" and exp.check_source is None
    assert command_spec(exp)["metric_source"] == "output"


def test_wall_needs_no_pattern_and_is_a_time_lower_is_better() -> None:
    text = config('metric_source = "wall"').replace('metric = "run_s"', 'metric = "quality"')
    exp = parse(text).experiment("train")
    assert exp.metric_source == "wall" and exp.time_metric  # whatever the name says
    spec = command_spec(exp)
    assert spec["metric_source"] == "wall" and spec["time_metric"] is True


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (f'metric_source = "wall"\n{PATTERN}', "`metric_pattern` reads the run's own output"),
        (
            'metric_source = "wall"\nmetric_file = "m.json"\nmetric_key = "t"',
            "`metric_file` reads the run's own output",
        ),
        ('metric_source = "wall"\ndirection = "higher"', "direction must be 'lower'"),
        ('metric_source = "wall"\nmetric_unit = "other"', "is a time"),
        ('metric_source = "clock"', "'output', 'wall' or 'evaluator'"),
        ('metric_source = "evaluator"', "needs `evaluator`"),
        (f'metric_source = "evaluator"\n{EVALUATOR}', "needs `evaluator`"),
        (
            f'metric_source = "evaluator"\n{EVALUATOR}{PATTERN}\n'
            "evaluator_metric_pattern = 'loss (?P<value>[0-9.]+)'",
            "`metric_pattern` reads the run's own output",
        ),
        (f"{PATTERN}\nevaluator_metric_pattern = 'x (?P<value>.+)'", "only with metric_source"),
        (f"{PATTERN}\n{EVALUATOR}", "declare at least one"),
        (f'{PATTERN}\nartifacts = ["out/m.pt"]', "`artifacts` is read by the evaluator"),
        (
            f"{PATTERN}\n{EVALUATOR}evaluator_check_pattern = 'loss (?P<v>.+)'",
            "has no named group `value`",
        ),
        (
            f"{PATTERN}\n{EVALUATOR}evaluator_check_pattern = 'l (?P<value>.+)'\n"
            "check_pattern = 'v (?P<value>.+)'",
            "both declare the quality gate",
        ),
        (
            f"{PATTERN}\n"
            'evaluator = ["python", "e.py", "{artifact}"]\nartifacts = ["a", "b"]\n'
            "evaluator_check_pattern = 'l (?P<value>.+)'",
            "needs exactly one declared artifact",
        ),
        (
            f"{PATTERN}\n"
            'evaluator = ["python", "e.py", "{width}"]\n'
            "evaluator_check_pattern = 'l (?P<value>.+)'",
            "evaluator placeholder {width}",
        ),
        (
            f"{PATTERN}\n"
            'evaluator = ["python", "e.py"]\nartifacts = ["../x"]\n'
            "evaluator_check_pattern = 'l (?P<value>.+)'",
            "relative to the run's tree",
        ),
    ],
)
def test_a_bad_source_declaration_names_the_key_and_the_form(extra: str, expected: str) -> None:
    assert expected in error(config(extra))


def test_an_evaluator_gives_the_metric_or_the_gate_and_the_spec_says_which() -> None:
    exp = parse(
        config(
            f'metric_source = "evaluator"\n{EVALUATOR}'
            "evaluator_metric_pattern = 'holdout loss (?P<value>[0-9.]+)'\n"
            "evaluator_check_pattern = 'accuracy (?P<value>[0-9.]+)'\n"
        )
    ).experiment("train")
    assert exp.check_source == "evaluator"
    spec = command_spec(exp)
    assert spec["metric_source"] == "evaluator"
    assert spec["check"] == {"direction": "lower", "tolerance": 0.02, "source": "evaluator"}
    # each recorded run is evaluated too, under the same limit
    assert exp.longest_job_s == exp.time_limit_s * (3 * exp.repeats * 2)
    argv = command.render_evaluator(exp.evaluator, exp.artifacts, "/a/007", "cpu")
    assert argv == ["python", "holdout/evaluate.py", "--model=/a/007/out/model.json"]


def test_an_output_check_is_marked_as_the_outputs() -> None:
    exp = parse(config(f"{PATTERN}\ncheck_pattern = 'v (?P<value>.+)'")).experiment("train")
    assert command_spec(exp)["check"]["source"] == "output"


def test_a_harness_experiment_takes_no_source_keys() -> None:
    text = '[project]\nname = "h"\n[experiments.e]\nentry = "bench.main"\nmetric_source = "wall"\n'
    assert "`metric_source` is for kind = 'command'" in error(text)
    text = '[project]\nname = "h"\n[experiments.e]\nentry = "m"\nevaluator = ["python", "e.py"]\n'
    assert "`evaluator` is for kind = 'command'" in error(text)


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        ('["/etc/x"]', "relative to the repository root"),
        ('["../up"]', "relative to the repository root"),
        ('["data/*.json"]', "no glob"),
        ('["autopilot.toml"]', "cannot be hidden"),
    ],
)
def test_hidden_paths_are_relative_files_or_folders(paths: str, expected: str) -> None:
    assert expected in error(config(PATTERN, f"hidden_paths = {paths}"))


def test_hidden_paths_are_read_bare() -> None:
    cfg = parse(config(PATTERN, 'hidden_paths = ["./holdout/", "data/test.json"]'))
    assert cfg.project.hidden == ["holdout", "data/test.json"]


def test_hidden_paths_are_protected_and_left_out_of_the_agents_prompt() -> None:
    text = config(PATTERN, 'protected_paths = ["bench.py"]\nhidden_paths = ["holdout"]')
    assert protected.patterns_from_config(text)[-2:] == ["bench.py", "holdout"]
    assert protected.is_protected("holdout/data.json", protected.patterns_from_config(text))
    cfg = parse(text)
    assert "holdout" in prompt.protected_paths(cfg)
    files = ["train.py", "holdout/data.json", "holdout/evaluate.py", "holdouts.txt"]
    assert prompt.visible_files(files, cfg) == ["train.py", "holdouts.txt"]
