"""`autopilot demo`: one whole cycle on the embedded defaults, no server installed.

Copies `experiments/projects/complex_contraction` into a fresh git repository in the state
dir, registers it, starts the API and the workers (control and one `gpu.cpu`), triggers a
cycle over REST, follows it, and prints the verdict, the headline figure and where to review.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from app import demo_lock, migrate
from app.cycles import states
from app.db import Stores
from app.projects import service as ops
from app.projects.exceptions import ProjectNotFound
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from workers.launcher.launch import dies_with_parent, killpg

TEMPLATE = (
    Path(__file__).resolve().parent.parent / "experiments" / "projects" / "complex_contraction"
)
PROJECT = "complex-contraction"


def make_repo(state_dir: Path) -> Path:
    """A fresh research repository holding the example project (made once, then reused)."""
    repo = state_dir.absolute() / "demo" / PROJECT
    if (repo / ".git").exists():
        return repo
    shutil.copytree(TEMPLATE, repo, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {**_git_env(), "GIT_DIR": str(repo / ".git"), "GIT_WORK_TREE": str(repo)}
    for argv in (
        ["git", "init", "--quiet", "--initial-branch=main", str(repo)],
        ["git", "add", "--all"],
        ["git", "commit", "--quiet", "-m", "Example research project"],
    ):
        subprocess.run(  # noqa: S603 - fixed git argv
            argv,
            cwd=repo,
            env=env if argv[1] != "init" else _git_env(),  # noqa: S603
            check=True,
            capture_output=True,
        )
    return repo


def _git_env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/"),
        "GIT_AUTHOR_NAME": "demo",
        "GIT_AUTHOR_EMAIL": "demo@localhost",
        "GIT_COMMITTER_NAME": "demo",
        "GIT_COMMITTER_EMAIL": "demo@localhost",
    }


#: How a user stops the demo: Ctrl-C in its terminal, closing that terminal, `kill`.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: How long each service gets for its warm shutdown before its process group is killed.
GRACE_S = 15.0


class StopRequested(BaseException):
    """A stop signal reached the demo (a BaseException, like KeyboardInterrupt: nothing on the
    way up may swallow it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _raise_stop(signum: int, _frame: object) -> None:
    raise StopRequested(signum)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP all raise StopRequested while the demo runs, so that each
    unwinds through `services` and stops them in order."""
    previous = {sig: signal.signal(sig, _raise_stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def services(
    settings: Settings, log_dir: Path, *, worker_token: str, lock: demo_lock.DemoLock
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """The API, the control worker (with beat) and one CPU GPU-worker, as child processes. The
    GPU worker talks to the others only through the broker, the ops DB and the API (its own
    token), as a GPU host on another machine would.

    Each service leads a session of its own (a terminal's Ctrl-C reaches only the demo, which
    stops them in order) and gets SIGTERM when the demo dies, however it dies (the launcher's
    parent-death signal; SIGTERM so that Celery still shuts down warm). Its pid goes into the
    demo's lock file, where `autopilot status` finds it."""
    env = dict(os.environ)
    # The demo's project venv reuses this environment's torch instead of installing one.
    env.setdefault("AUTOPILOT_VENV_SYSTEM_SITE_PACKAGES", "true")
    env["AUTOPILOT_STATE_DIR"] = str(settings.state_dir.absolute())
    log_dir.mkdir(parents=True, exist_ok=True)
    commands = {
        "api": ["serve"],
        "control": ["worker", "control", "--beat", "--loglevel", "WARNING"],
        "gpu-cpu-0": ["worker", "gpu", "--kind", "cpu", "--device", "0", "--loglevel", "WARNING"],
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, args in commands.items():
            own = {"AUTOPILOT_CONTROL_TOKEN": worker_token} if args[1:2] == ["gpu"] else {}
            with open(log_dir / f"{name}.log", "ab") as log:
                procs[name] = subprocess.Popen(  # noqa: S603 - our own CLI, fixed argv
                    [sys.executable, "-m", "workers.cli", *args],
                    env={**env, **own},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=dies_with_parent(os.getpid(), signal.SIGTERM),
                )
            lock.add_service(name, procs[name].pid)
        yield procs
    finally:
        stop(procs)


def stop(procs: dict[str, subprocess.Popen[bytes]], grace: float = GRACE_S) -> None:
    """SIGTERM to every service's group, then each awaited in order for up to `grace` seconds;
    then SIGKILL to its group, which also takes any process its leader left behind. A second
    stop signal (Ctrl-C again) cuts the grace short."""
    hurry: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: hurry.append(signum))
    for proc in procs.values():
        killpg(proc.pid, signal.SIGTERM)
    for proc in procs.values():
        deadline = time.monotonic() + grace
        while not _exited(proc) and time.monotonic() < deadline and not hurry:
            time.sleep(0.05)
        # Before the leader is reaped, so that its pid (the group's id) cannot be reused yet.
        killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the process has exited, without reaping it."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens on host:port (probed as uvicorn binds, with
    SO_REUSEADDR, so a port a previous demo left in TIME_WAIT counts as free)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror:
        return False  # the API reports a bad host itself
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def wait_healthy(base: str, procs: dict[str, subprocess.Popen[bytes]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs.values()):
            raise RuntimeError("a service exited while starting; see the logs in var/demo/logs")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the API did not answer on {base} within {timeout:g} s")


def follow(
    base: str, token: str, cycle_id: int, quiet: bool, timeout: float = 900
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    started, seen = time.monotonic(), ""
    while time.monotonic() - started < timeout:
        cycle: dict[str, Any] = httpx.get(
            f"{base}/api/v1/cycles/{cycle_id}", headers=headers, timeout=10
        ).json()
        if cycle["state"] != seen and not quiet:
            seen = cycle["state"]
            typer.echo(
                f"  [{time.monotonic() - started:6.1f} s] cycle {cycle_id}: {seen}", err=True
            )
        if cycle["state"] in states.SETTLED:
            return cycle
        time.sleep(0.5)
    raise RuntimeError(f"cycle {cycle_id} did not reach review within {timeout:g} s")


def demo_command(
    once: Annotated[
        bool, typer.Option("--once", help="Stop after the cycle awaits review")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON")] = False,
) -> None:
    """Run one whole cycle on the example project and leave the service up for review.

    One demo per state dir (the lock `<state dir>/demo.lock`); Ctrl-C, closing the terminal or
    `kill` stop its services in order, and they die with it even on `kill -9`."""
    from app.cli.common import fail, load_settings

    settings = load_settings()
    base = f"http://{settings.host}:{settings.port}"
    try:
        lock, stale = demo_lock.acquire(settings.state_dir, base)
    except demo_lock.DemoRunning as exc:
        stop_it = f"kill {exc.record.pid}" if exc.record else "stop it"
        fail(f"{exc}; {stop_it}, or give this one another AUTOPILOT_STATE_DIR")
    try:
        if stale is not None:
            typer.echo(
                f"a stale demo lock (pid {stale.pid}, started {stale.started_at}, no longer "
                "running) was taken over",
                err=True,
            )
        if port_taken(settings.host, settings.port):
            fail(
                f"port {settings.port} on {settings.host} is taken by another process; "
                f"choose another with AUTOPILOT_PORT (e.g. AUTOPILOT_PORT={settings.port + 1})"
            )
        with stop_signals():
            try:
                _run(settings, base, lock, once=once, as_json=as_json)
            except StopRequested as stop:
                typer.echo(f"stopped by {stop} before the cycle finished", err=True)
                raise typer.Exit(128 + stop.signum) from None
    finally:
        lock.release()


def _run(
    settings: Settings, base: str, lock: demo_lock.DemoLock, *, once: bool, as_json: bool
) -> None:
    migrate.upgrade(settings)
    repo = make_repo(settings.state_dir)
    stores = Stores.from_settings(settings)
    with stores.ops_session() as session:
        try:
            ops.get_project(session, PROJECT)
        except ProjectNotFound:
            ops.create_project(session, ProjectCreate(name=PROJECT, repo_url=str(repo)))
        _, token = ops.create_token(session, f"demo-{secrets.token_hex(3)}", ["admin"])
        # The GPU host's own token: it fetches each job's commit from the API's git endpoint.
        _, worker_token = ops.create_token(session, f"demo-gpu-{secrets.token_hex(3)}", ["worker"])
    stores.dispose()
    quiet = as_json
    log_dir = settings.state_dir.absolute() / "demo" / "logs"
    with services(settings, log_dir, worker_token=worker_token, lock=lock) as procs:
        wait_healthy(base, procs)
        if not quiet:
            typer.echo(f"API up on {base}; triggering a cycle on {PROJECT}", err=True)
        created = httpx.post(
            f"{base}/api/v1/cycles",
            json={"project": PROJECT},
            headers={
                "Authorization": f"Bearer {token}",
                "Idempotency-Key": f"demo-{secrets.token_hex(4)}",
            },
            timeout=30,
        )
        created.raise_for_status()
        cycle = follow(base, token, created.json()["id"], quiet)
        outcome = {
            "cycle_id": cycle["id"],
            "state": cycle["state"],
            "verdict": cycle["verdict"],
            "pr_url": cycle["pr_url"],
            "dashboard_url": f"{base}/dashboard/cycles/{cycle['id']}",
        }
        if as_json:
            typer.echo(json.dumps(outcome))
        else:
            _print_outcome(cycle, outcome["dashboard_url"], token)
        if once:
            if cycle["state"] != "awaiting_review":
                raise typer.Exit(1)
            return
        typer.echo(
            f"\nThe service keeps running; Ctrl-C (or kill {os.getpid()}) stops it.", err=True
        )
        try:
            while all(p.poll() is None for p in procs.values()):
                time.sleep(1)
        except StopRequested:
            return  # the services stop on the way out of `services`
        gone = ", ".join(name for name, p in procs.items() if p.poll() is not None)
        typer.echo(f"{gone} exited (see {log_dir}); stopping the other services", err=True)
        raise typer.Exit(1)


def _print_outcome(cycle: dict[str, Any], dashboard_url: str, token: str) -> None:
    typer.echo(f"\nverdict:   {cycle['verdict']} ({cycle['state']})")
    headline = cycle.get("headline") or {}
    if "ratio" in headline:
        typer.echo(
            f"headline:  ratio {headline['ratio']:.3f}, 95% CI "
            f"[{headline.get('ci_low', float('nan')):.3f}, "
            f"{headline.get('ci_high', float('nan')):.3f}]"
        )
    if cycle.get("error"):
        typer.echo(f"error:     {cycle['error']}")
    typer.echo(f"PR:        {cycle['pr_url']}")
    typer.echo(f"review at: {dashboard_url}")
    typer.echo(f"log in with this token (shown once): {token}")
