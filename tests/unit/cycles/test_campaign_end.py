"""When a campaign stops starting rounds (`limits.why_end`): a stop, `max_cycles`,
`max_hours`, and `stop_after_no_gain` steps in a row that were not kept, counted in the order
they were decided."""

from __future__ import annotations

from datetime import timedelta

from app.clock import utcnow
from app.cycles.campaigns.limits import why_end as _why_end
from app.cycles.campaigns.models import Campaign, CampaignStep


def campaign(**fields: object) -> Campaign:
    base: dict[str, object] = {
        "max_cycles": 10,
        "parallel": 1,
        "stop_requested": False,
        "created_at": utcnow(),
    }
    return Campaign(**{**base, **fields})


def steps(*outcomes: str) -> list[CampaignStep]:
    now = utcnow()
    return [
        CampaignStep(
            cycle_id=i + 1,
            round=i + 1,
            tip_sha="a" * 40,
            outcome=o,
            decided_at=now + timedelta(seconds=i),
        )
        for i, o in enumerate(outcomes)
    ]


def test_a_campaign_under_its_limits_goes_on() -> None:
    assert _why_end(campaign(stop_after_no_gain=3), steps("kept", "discarded")) is None


def test_max_cycles_counts_steps() -> None:
    why = _why_end(campaign(max_cycles=2), steps("kept", "discarded"))
    assert why == "max_cycles reached (2 steps)"


def test_a_stop_ends_it_with_who_asked() -> None:
    why = _why_end(campaign(stop_requested=True, end_reason="stopped by ci"), steps())
    assert why == "stopped by ci"


def test_max_hours_from_its_start() -> None:
    old = campaign(max_hours=1.0, created_at=utcnow() - timedelta(hours=1, seconds=1))
    assert _why_end(old, steps("kept")) == "max_hours reached (1 h)"
    assert _why_end(campaign(max_hours=1.0), steps("kept")) is None


def test_no_gain_counts_the_latest_run_of_steps_not_kept() -> None:
    limit = campaign(stop_after_no_gain=2)
    assert _why_end(limit, steps("discarded", "kept", "discarded")) is None
    why = _why_end(limit, steps("kept", "discarded", "discarded"))
    assert why == "stop_after_no_gain reached (2 steps in a row not kept)"
    # Decided order, not start order: a keep decided last breaks the run.
    late_keep = steps("kept", "discarded", "discarded")
    late_keep[0].decided_at = utcnow() + timedelta(hours=1)
    assert _why_end(limit, late_keep) is None
    # A step still being decided is not counted.
    pending = steps("discarded", "discarded")
    pending[1].decided_at = None
    assert _why_end(limit, pending) is None
