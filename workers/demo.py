"""`autopilot demo`: one whole cycle on the embedded defaults, no server installed.

Copies `experiments/projects/complex_contraction` into a fresh git repository in the state
dir, registers it, starts the API and the workers (control and one `gpu.cpu`), triggers a
cycle over REST, follows it, and prints the verdict, the headline figure and where to review.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from app import migrate
from app.cycles import service as cycles
from app.db import Stores
from app.projects import service as ops
from app.projects.exceptions import ProjectNotFound
from app.projects.schemas import ProjectCreate
from app.settings import Settings

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


@contextlib.contextmanager
def services(
    settings: Settings, log_dir: Path, *, worker_token: str
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The API, the control worker (with beat) and one CPU GPU-worker, as child processes. The
    GPU worker talks to the others only through the broker, the ops DB and the API (its own
    token), as a GPU host on another machine would."""
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
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, args in commands.items():
            log = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the child
            own = {"AUTOPILOT_CONTROL_TOKEN": worker_token} if args[1:2] == ["gpu"] else {}
            procs.append(
                subprocess.Popen(  # noqa: S603 - our own CLI, fixed argv
                    [sys.executable, "-m", "workers.cli", *args],
                    env={**env, **own},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def wait_healthy(base: str, procs: list[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
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
        if cycle["state"] in cycles.SETTLED:
            return cycle
        time.sleep(0.5)
    raise RuntimeError(f"cycle {cycle_id} did not reach review within {timeout:g} s")


def demo_command(
    once: Annotated[
        bool, typer.Option("--once", help="Stop after the cycle awaits review")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON")] = False,
) -> None:
    """Run one whole cycle on the example project and leave the service up for review."""
    from app.cli.common import load_settings

    settings = load_settings()
    base = f"http://{settings.host}:{settings.port}"
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
    with services(settings, log_dir, worker_token=worker_token) as procs:
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
            headline = cycle.get("headline") or {}
            typer.echo(f"\nverdict:   {cycle['verdict']} ({cycle['state']})")
            if "ratio" in headline:
                typer.echo(
                    f"headline:  ratio {headline['ratio']:.3f}, 95% CI "
                    f"[{headline.get('ci_low', float('nan')):.3f}, "
                    f"{headline.get('ci_high', float('nan')):.3f}]"
                )
            if cycle.get("error"):
                typer.echo(f"error:     {cycle['error']}")
            typer.echo(f"PR:        {cycle['pr_url']}")
            typer.echo(f"review at: {outcome['dashboard_url']}")
            typer.echo(f"log in with this token (shown once): {token}")
        if once:
            if cycle["state"] != "awaiting_review":
                raise typer.Exit(1)
            return
        typer.echo("\nThe service keeps running; Ctrl-C stops it.", err=True)
        with contextlib.suppress(KeyboardInterrupt):
            while all(p.poll() is None for p in procs):
                time.sleep(1)
