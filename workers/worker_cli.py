"""`autopilot worker gpu|control` and `autopilot beat`: start Celery with our queues."""

from __future__ import annotations

import os
import re
import socket
from typing import Annotated

import typer

from app.settings import Settings

worker_app = typer.Typer(
    help="Start workers: one per GPU, and the control worker.", no_args_is_help=True
)
#: A worker host's command line, `autopilot worker gpu|control`: `workers.cli` runs it without
#: the control plane's commands.
worker_command = typer.Typer(name="autopilot", add_completion=False, no_args_is_help=True)
worker_command.add_typer(worker_app, name="worker")
_DEVICE = re.compile(r"^[0-9]+(,[0-9]+)*$|^$")


@worker_app.command("gpu")
def worker_gpu(
    kind: Annotated[str, typer.Option(help="GPU kind: its queue is gpu.<kind>")] = "cpu",
    device: Annotated[str, typer.Option(help="GPU index for CUDA_VISIBLE_DEVICES")] = "0",
    loglevel: Annotated[str, typer.Option()] = "INFO",
    deadline: Annotated[
        str | None,
        typer.Option(
            envvar="AUTOPILOT_WORKER_DEADLINE",
            help="Take no job whose time limit runs past this time (epoch seconds or ISO 8601 "
            "with its offset): a host lent until then, e.g. a Slurm allocation",
        ),
    ] = None,
    start_checks: Annotated[
        bool,
        typer.Option(
            help="Check the token, the devices and the sandbox first, and refuse to start "
            "when jobs could not run (--no-start-checks: benchmarks with no API)"
        ),
    ] = True,
) -> None:
    """Consume gpu.<kind> with concurrency 1, pinned to one device."""
    from app.cli.common import load_settings
    from workers.lease_gate import GATE, parse_deadline

    settings = load_settings()
    if not _DEVICE.match(device):
        typer.echo(f"error: --device {device!r} must be a GPU index like 0 or 0,1", err=True)
        raise typer.Exit(2)
    if deadline is not None:
        try:
            GATE.deadline = parse_deadline(deadline)
        except ValueError as exc:
            typer.echo(f"error: --deadline / AUTOPILOT_WORKER_DEADLINE: {exc}", err=True)
            raise typer.Exit(2) from None
    if start_checks:
        refuse_unless_ready(settings, kind, device)
    elif kind not in settings.gpu_kinds:
        typer.echo(f"error: unknown GPU kind {kind!r}; configured: {settings.gpu_kinds}", err=True)
        raise typer.Exit(2)
    # A CPU "GPU" worker's device numbers too: what a job of several sees, so its assignment
    # shows (there are no device nodes to bind on a CPU host).
    os.environ["CUDA_VISIBLE_DEVICES"] = device

    from app.db import Stores
    from app.jobs import service as jobs
    from workers import log_outbox, tasks
    from workers.celery_app import celery
    from workers.gpu.tickets import WorkerIdentity

    me = WorkerIdentity.for_device(kind, device)
    me.name = f"gpu-{kind}-{device}-{os.getpid()}@{socket.gethostname()}"
    tasks.IDENTITY = me
    with Stores.from_settings(settings).ops_session() as session:
        # Its pid: the leader of a gang job on this host checks its members by it.
        jobs.register_worker(session, me.name, kind, device, host=me.host, pid=os.getpid())
    # The logs a worker of this host left in its outbox (killed after storing an outcome,
    # before the control host had the log) are sent from now on, off any job's path.
    log_outbox.sender_for(tasks.stores(), settings)
    if settings.sandbox != "on":
        from workers.launcher import execstub

        # Its first cold job is exec'd by a stub waiting in a cgroup already (with the death
        # watch that covers it); the loop keeps one ready after that (`RunLoop.exec_stub`).
        execstub.prepare()
    # Solo pool: one job at a time in this process; nothing to isolate on a single GPU, and no
    # fork or IPC on the path between one job's end and the next one's start.
    celery.worker_main(
        [
            "worker",
            "-Q",
            me.queue,
            "-P",
            "solo",
            "-c",
            "1",
            "-n",
            me.name,
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            loglevel,
        ]
    )


def refuse_unless_ready(settings: Settings, kind: str, device: str) -> None:
    """The start checks (`gpu_start.start_checks`, which `autopilot doctor gpu-host` runs too):
    exit 2 with one line naming what to fix at the first that fails; warnings go to stderr."""
    from workers import gpu_start

    for check in gpu_start.start_checks(settings, kind, device):
        if not check.ok:
            typer.echo(gpu_start.refusal(check), err=True)
            raise typer.Exit(2)
        if check.warn:
            typer.echo(f"warning: {check.detail}", err=True)


@worker_app.command("control")
def worker_control(
    beat: Annotated[bool, typer.Option("--beat", help="Also run the beat schedule")] = False,
    concurrency: Annotated[
        int,
        typer.Option(min=0, max=64, help="Threads; 0: sized to the machine (4 per core, 8-16)"),
    ] = 0,
    loglevel: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Consume the control queue (cycle steps, merges, schedules, the reaper). Jobs are
    prepared on the GPU hosts, by their GPU workers."""
    from app.cli.common import load_settings
    from app.sandbox import confined
    from workers.celery_app import celery

    if load_settings().sandbox == "on" and (missing := confined.check()):
        # The sweep planner runs no untrusted code; a command agent's cycle fails with this.
        typer.echo(
            f"warning: command agents cannot run sandboxed on this host: {missing}; their "
            "cycles will fail until it can (or AUTOPILOT_SANDBOX=off runs them unconfined)",
            err=True,
        )

    threads = concurrency or control_concurrency(os.cpu_count() or 1)
    argv = control_argv(load_settings(), threads, loglevel, beat=beat)
    celery.worker_main(argv)


def beat_command(loglevel: Annotated[str, typer.Option()] = "INFO") -> None:
    """Run the beat schedule (the reaper, project schedules). Run exactly one per deployment."""
    from workers.celery_app import celery

    celery.start(["beat", "--loglevel", loglevel])


def control_concurrency(cores: int) -> int:
    """The control worker's threads on a machine of `cores`: 4 per core, 8 to 16.

    A cycle step spends its time waiting on git subprocesses, the database and the forge, not
    on Python, so threads (one GIL) overlap them; more threads than 4 a core only queue on the
    cores and on the database pool (5 + 10 connections an engine). bench/fleet.py measured it
    (docs/benchmarks.md, "fleet"). Per-cycle order does not depend on it: `Machine.advance`
    holds a lock per cycle."""
    return max(8, min(16, 4 * cores))


def control_argv(settings: Settings, concurrency: int, loglevel: str, *, beat: bool) -> list[str]:
    """The control worker's Celery argv. With Redis (where docker-compose.yml runs Flower), it
    sends task events, so Flower's task pages show the control queue's work (cycle steps,
    merges, the reaper, schedule ticks); the embedded filesystem broker has no event fan-out."""
    argv = [
        "worker",
        "-Q",
        "control",
        "-P",
        "threads",
        "-c",
        str(concurrency),
        "-n",
        f"control-{os.getpid()}@{socket.gethostname()}",
        "--without-gossip",
        "--without-mingle",
        "--loglevel",
        loglevel,
    ]
    if settings.broker_url.startswith(("redis://", "rediss://")):
        argv.append("--task-events")
    if beat:
        argv.append("--beat")
    return argv
