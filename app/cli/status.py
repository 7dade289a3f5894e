"""`autopilot status`: queues, workers, jobs and cycles at a glance (what /metrics exports), and
the services of the demo running on this state dir, if one is."""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy.exc import SQLAlchemyError

from app import demo_lock
from app.cli.common import echo_json, fail, load_settings, open_stores
from app.cli.failures import describe
from app.clock import age_text
from app.settings import Settings
from app.status import Snapshot, take_snapshot


def _age(seconds: float | None) -> str:
    return age_text(seconds, "compact")


def render_status(snapshot: Snapshot, settings: Settings) -> str:
    lines = [f"at {snapshot.taken_at:%Y-%m-%d %H:%M:%S} UTC"]
    lines += ["", "QUEUES", f"  {'queue':14} {'depth':>5} {'oldest':>7} {'running':>7}"]
    lines[-1] += f" {'idle gap':>8} {'duty':>5}"
    for q in snapshot.queues:
        duty = f"{q.duty_cycle:.0%}" if q.duty_cycle is not None else "-"
        lines.append(
            f"  {q.queue:14} {q.queued:>5} {_age(q.oldest_age_s):>7} {q.running:>7}"
            f" {_age(q.idle_gap_median_s):>8} {duty:>5}"
        )
    lines += ["", "WORKERS"]
    if not snapshot.workers:
        lines.append("  none registered")
    stale_after = 3 * settings.heartbeat_interval_s
    for w in snapshot.workers:
        job = f"job {w.current_job_id}" if w.current_job_id is not None else "idle"
        stale = (
            "  (stale)" if w.current_job_id is not None and w.last_seen_age_s > stale_after else ""
        )
        lines.append(
            f"  {w.name:40} device {w.device or '-':5} {job:10} "
            f"seen {_age(w.last_seen_age_s)} ago{stale}"
        )
    by_state = snapshot.jobs_by_state()
    lines += ["", "JOBS", "  " + _counts(by_state)]
    if snapshot.cycles is not None:
        lines += ["", "CYCLES", "  " + _counts(snapshot.cycles)]
    expiries = sum(snapshot.lease_expiries.values())
    lines += ["", f"lease expiries: {expiries}"]
    return "\n".join(lines)


def render_demo(demo: demo_lock.DemoRecord) -> str:
    lines = ["", f"DEMO  pid {demo.pid} on {demo.url}, since {demo.started_at}"]
    for service in demo.as_json()["services"]:
        state = "alive" if service["alive"] else "gone"
        lines.append(f"  {service['name']:14} pid {service['pid']:<8} {state}")
    return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return "  ".join(f"{state} {count}" for state, count in sorted(counts.items())) or "none"


def status_command(
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object")] = False,
) -> None:
    """Queues, workers, jobs and cycles at a glance (the figures /metrics exports), and the
    demo's services when `autopilot demo` runs on this state dir."""
    settings = load_settings()
    demo = demo_lock.running(settings.state_dir)
    stores = open_stores(settings)
    try:
        with stores.ops_session() as session:
            snapshot = take_snapshot(session, settings)
    except SQLAlchemyError as exc:  # said here too: `status` also runs without the root
        fail(*describe(exc))
    finally:
        stores.dispose()
    if json_output:
        echo_json({**snapshot.as_json(), "demo": demo.as_json() if demo else None})
        return
    typer.echo(render_status(snapshot, settings) + (render_demo(demo) if demo else ""))
