"""An experiment's `stopping` as autopilot.toml declares it, and the rule the job's spec carries
for the runner and the judge (app/projects/config.py, app/jobs/service.py `command_spec`)."""

from __future__ import annotations

import pytest
from autopilot_harness import sequential

from app.jobs.service import command_spec
from app.projects.config import ConfigError, parse

CONFIG = """
[project]
name = "tiny"

[experiments.train]
kind = "command"
command = ["python", "train.py"]
metric = "run_s"
metric_source = "wall"
{extra}
"""


def test_a_fixed_design_is_the_default_and_writes_no_rule() -> None:
    declared = parse(CONFIG.format(extra="")).experiment("train")
    assert declared.stopping == "fixed" and "sequential" not in command_spec(declared)


def test_a_sequential_experiment_writes_its_rule_with_repeats_as_the_maximum() -> None:
    extra = 'stopping = "sequential"\nrepeats = 12\nmin_blocks = 4\nequivalence_margin = 0.03'
    spec = command_spec(parse(CONFIG.format(extra=extra)).experiment("train"))
    rule = sequential.Rule.from_dict(spec["sequential"])
    assert (rule.max_blocks, rule.min_blocks, rule.margin, rule.alpha) == (12, 4, 0.03, 0.05)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ('stopping = "sequential"\nrepeats = 4\nmin_blocks = 5', "min_blocks = 5 is above repeats"),
        ('stopping = "early"', "stopping"),
        ('stopping = "sequential"\nmin_blocks = 2', "min_blocks"),
        ('stopping = "sequential"\nequivalence_margin = 0', "equivalence_margin"),
    ],
)
def test_an_unusable_stopping_declaration_names_the_key(extra: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse(CONFIG.format(extra=extra))
