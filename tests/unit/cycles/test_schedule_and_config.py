"""Schedules, autopilot.toml parsing, and the sweep agent: pure logic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.agents import service as agents
from app.cycles import schedules as schedule
from app.errors import InvalidInput
from app.projects import config

TOML = """
[project]
name = "demo"
[experiments.e]
entry = "pkg.bench"
[experiments.e.parameters]
n = [1, 2]
mode = ["a", "b"]
[experiments.e.defaults]
n = 1
mode = "a"
"""


@pytest.mark.parametrize(
    ("expression", "ago", "due"),
    [
        ("every 2h", timedelta(hours=3), True),
        ("every 2h", timedelta(minutes=5), False),
        ("every 30m", timedelta(minutes=31), True),
        ("0 * * * *", timedelta(hours=2), True),
        ("0 0 1 1 *", timedelta(seconds=5), False),
    ],
)
def test_is_due(expression: str, ago: timedelta, due: bool) -> None:
    now = datetime(2026, 12, 2, 12, 30, tzinfo=UTC)
    assert schedule.is_due(expression, now - ago, now) is due
    assert schedule.is_due(expression, None, now) is True


@pytest.mark.parametrize(
    ("expression", "days", "fires"),
    [
        ("0 * * * *", 1, 24),  # hourly, on the hour
        ("0 3 * * *", 1, 1),  # daily at 03:00
        ("every 2h", 1, 12),
        ("30 9 * * 1", 7, 1),  # Mondays at 09:30
        ("*/15 8-9 * * 1-5", 7, 40),  # every quarter hour from 8 to 10, weekdays
    ],
)
def test_schedules_fire_as_declared_over_a_simulated_clock(
    expression: str, days: int, fires: int
) -> None:
    """A tick each minute over `days` from Sunday 2026-11-29 00:00:20 UTC (end included),
    counting fires after a run at the start."""
    start = datetime(2026, 11, 29, 0, 0, 20, tzinfo=UTC)
    last_run = start
    fired: list[datetime] = []
    for minute in range(1, days * 24 * 60 + 1):
        now = start + timedelta(minutes=minute)
        if schedule.is_due(expression, last_run, now):
            fired.append(now)
            last_run = now
    assert len(fired) == fires, fired[:5]
    if expression.startswith("0 "):
        assert all(f.minute == 0 for f in fired)  # on the hour, never at the half hour
    if expression == "30 9 * * 1":
        assert fired[0].weekday() == 0 and (fired[0].hour, fired[0].minute) == (9, 30)


def test_a_rare_rule_is_found_and_one_that_never_fires_is_refused() -> None:
    start = datetime(2026, 12, 4, tzinfo=UTC)
    assert schedule.next_fire(schedule.parse("0 0 29 2 1"), start) == datetime(
        2044, 2, 29, tzinfo=UTC
    )  # Feb 29 on a Monday
    with pytest.raises(InvalidInput, match="never occurs"):
        schedule.parse("0 0 31 2 *")  # Feb 31


def test_a_cron_expression_reads_its_fields_in_crons_order() -> None:
    rule = schedule.parse("30 9 1 2 3")
    assert (rule.minute, rule.hour, rule.day_of_month) == ({30}, {9}, {1})
    assert (rule.month_of_year, rule.day_of_week) == ({2}, {3})


def test_the_next_firing_time_is_counted_from_the_last_run_not_the_wall_clock() -> None:
    rule = schedule.parse("0 * * * *")
    last = datetime(2026, 12, 2, 12, 31, tzinfo=UTC)
    assert schedule.next_fire(rule, last) == datetime(2026, 12, 2, 13, 0, tzinfo=UTC)
    assert not schedule.is_due("0 * * * *", last, last + timedelta(minutes=28))
    assert schedule.is_due("0 * * * *", last, last + timedelta(minutes=29))


@pytest.mark.parametrize("bad", ["every 0h", "every two hours", "* * *", "99 * * * *"])
def test_bad_schedules_name_the_expected_form(bad: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        schedule.parse(bad)
    assert bad in caught.value.detail


def test_config_errors_name_file_key_and_form() -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.parse(
            TOML.replace('entry = "pkg.bench"', 'entry = "not a module"'), "x/autopilot.toml"
        )
    assert "x/autopilot.toml" in caught.value.detail
    assert "experiments.e.entry" in caught.value.detail
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        config.parse("[project", "autopilot.toml")
    with pytest.raises(config.ConfigError, match="'experiments.e.surprise'"):
        config.parse(TOML + "\n[experiments.e.surprise]\nx = 1\n")


def test_preload_takes_module_names_only() -> None:
    with_preload = TOML.replace('name = "demo"', 'name = "demo"\npreload = ["torch", "a.b"]')
    assert config.parse(with_preload).project.preload == ["torch", "a.b"]
    with pytest.raises(config.ConfigError) as caught:
        config.parse(TOML.replace('name = "demo"', 'name = "demo"\npreload = ["-c"]'))
    assert "project.preload" in caught.value.detail and "dotted module name" in caught.value.detail


def test_parameters_outside_the_space_are_refused() -> None:
    experiment = config.parse(TOML).experiment("e")
    assert experiment.check_parameters({"n": 2}) == {"n": 2, "mode": "a"}
    with pytest.raises(InvalidInput, match="outside the declared space"):
        experiment.check_parameters({"n": 3})
    with pytest.raises(InvalidInput, match="not declared"):
        experiment.check_parameters({"m": 1})


def test_sweep_walks_the_space_and_skips_covered_points() -> None:
    cfg = config.parse(TOML)
    covered = [{"n": 1, "mode": "a"}, {"n": 1, "mode": "b"}]
    context = agents.Context("demo", "cpu", cfg, is_covered=lambda _e, p: p in covered)
    proposal = agents.SweepAgent().propose(context)
    assert proposal is not None
    assert proposal.parameters == {"n": 2, "mode": "a"}
    assert agents.validate(proposal, cfg) is proposal
    everything = agents.Context("demo", "cpu", cfg, is_covered=lambda _e, _p: True)
    assert agents.SweepAgent().propose(everything) is None
