"""The API app with the dashboard mounted, signed-in clients, and cycles built directly in the DB.

A cycle here is made by hand (no workers): a real research repo, a branch with the report files
committed under results/<cycle>/, pushed to the local forge's bare repo and opened as a PR, and
its findings recorded in memory as *proposed*, as the cycle machine would leave them.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from autopilot_harness import sequential
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.clock import utcnow
from app.cycles.headline import headline
from app.cycles.judge import judge
from app.cycles.models import Cycle
from app.cycles.pull_request import links, pr_body, pr_title
from app.db import Stores
from app.forge.base import ProjectRef
from app.forge.local import LocalForge
from app.git.work import GitWork
from app.jobs import stopping
from app.jobs.models import Job
from app.memory import service as memory
from app.memory.schemas import Evidence, FindingCreate
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.reports import cycle as report
from app.settings import Settings
from tests.integration.queue.conftest import make_repo

CHANGES = "probe: fused loop"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
PLOT = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="120" height="60" viewBox="0 0 120 60">'
    '<rect x="10" y="10" width="100" height="40" fill="#1f5fbf"/></svg>'
)


def build_app(settings: Settings, stores: Stores) -> FastAPI:
    return create_app(settings, stores)


@pytest.fixture
def app(settings: Settings, stores: Stores) -> FastAPI:
    return build_app(settings, stores)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as client:
        yield client


@pytest.fixture
def tokens(stores: Stores) -> dict[str, str]:
    made: dict[str, str] = {}
    with stores.ops_session() as session:
        made["review"] = ops.create_token(session, "alice", ["review"])[1]
        made["reader"] = ops.create_token(session, "bob", ["trigger"])[1]
        made["admin"] = ops.create_token(session, "root", ["admin"])[1]
    return made


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no CSRF field on the page"
    return match.group(1)


def login(client: TestClient, token: str, next_path: str = "/dashboard/") -> str:
    """Sign in through the form; returns the session's CSRF token (from the next page)."""
    form = client.get("/dashboard/login")
    assert form.status_code == 200
    done = client.post(
        "/dashboard/login",
        data={"token": token, "csrf_token": csrf_of(form.text), "next": next_path},
        follow_redirects=False,
    )
    assert done.status_code == 303, done.text
    page = client.get(done.headers["location"])
    assert page.status_code == 200
    return csrf_of(page.text)


@dataclass
class Made:
    cycle_id: int
    project: ProjectRef
    finding_ids: list[str]
    repo: Path


def result_for(device: str = "cpu-test") -> dict[str, Any]:
    return {
        "status": "ok",
        "experiment": "probe",
        "verdict": "faster",
        "ratio": 0.8,
        "ci_low": 0.75,
        "ci_high": 0.86,
        "environment": {"device_name": device, "torch": "2.13.0", "python": "3.11.9"},
    }


def harness_judged_result(seed: int = 3) -> dict[str, Any]:
    """A harness experiment's result as the control plane's own judge leaves it: one variant
    about 20% faster than the baseline in paired, interleaved calls, accuracy within tolerance,
    with its A/A pairs and environment."""
    a = [1_000_000.0 + 997 * (i % 5) for i in range(20)]
    b = [0.8 * v + 311 * ((3 * i) % 4) for i, v in enumerate(a)]
    aa = [v + 311 * ((3 * i) % 4) - 400 for i, v in enumerate(a)]
    raw = {
        "status": "ok",
        "experiment": "matmul",
        "parameters": {"n": 256},
        "device": "cpu",
        "repeats": len(a),
        "noise_floor": {"samples": {"a_ns": a, "b_ns": aa}},
        "comparisons": [
            {
                "variant": "fused",
                "baseline": "naive",
                "samples": {"a_ns": a, "b_ns": b},
                "accuracy": {"max_abs_error": 1e-7, "scale": 1.0},
            }
        ],
        "environment": {"device_name": "cpu", "python": "3.11.9", "torch": "2.4.0"},
    }
    return judge(raw, {"seed": seed, "tolerance": {"rtol": 1e-5, "atol": 1e-8}})


def stopped_command_result(seed: int = 7) -> dict[str, Any]:
    """A command experiment's result as the control plane's own judge leaves it, whose blocks a
    sequential rule stopped before its maximum: the candidate about 15% faster on the runner's
    clock, the check value from the hold-out evaluator, every run with its time (as the runner
    records them; docs/design.md, "Sequential verdicts")."""
    rule = sequential.Rule(max_blocks=12)
    gate = {"direction": "lower", "tolerance": 0.02, "source": "evaluator"}
    spec = {
        "kind": "command",
        "metric": "run_s",
        "direction": "lower",
        "time_metric": True,
        "metric_source": "wall",
        "seed": seed,
        "check": gate,
        "sequential": rule.as_dict(),
    }
    values: dict[str, list[float]] = {"baseline": [], "candidate": [], "baseline_aa": []}
    checks: dict[str, list[float]] = {"baseline": [], "candidate": []}
    runs: list[dict[str, Any]] = []
    decision = "continue"
    for block in range(rule.max_blocks):
        base = 2.0 + 0.013 * ((5 * block) % 7)
        for role, arm, value in (
            ("candidate", "candidate", base * 0.85 + 0.004 * (block % 3)),
            ("baseline", "baseline", base),
            ("baseline_aa", "baseline", base + 0.011 * ((3 * block) % 5) - 0.02),
        ):
            value = round(value, 4)
            values[role].append(value)
            if role != "baseline_aa":
                checks[arm].append(0.05)
            runs.append(
                {
                    "index": len(runs),
                    "block": block,
                    "arm": arm,
                    "role": role,
                    "value": value,
                    "check": 0.05,
                    "exit_code": 0,
                    "duration_s": value,
                }
            )
        if block + 1 < rule.min_blocks:
            continue
        decision, _ = stopping.decide(rule, values, checks, gate, seed)  # the runner's
        if decision != "continue":
            break
    raw = {
        "status": "ok",
        "kind": "command",
        "experiment": "train",
        "parameters": {"width": 32},
        "metric": "run_s",
        "metric_source": "wall",
        "check_source": "evaluator",
        "direction": "lower",
        "device": "cpu",
        "repeats": rule.max_blocks,
        "arms": {
            "baseline": {
                "commit": "b" * 40,
                "parameters": {"width": 16},
                "command": ["python", "train.py"],
            },
            "candidate": {
                "commit": "c" * 40,
                "parameters": {"width": 32},
                "command": ["python", "train.py"],
            },
        },
        "runs": runs,
        "samples": values,
        "checks": {"metric": "val_loss", **checks},
        "stopped": {"decision": decision},
        "environment": {"device_name": "cpu", "python": "3.11.9", "torch": "2.4.0"},
    }
    return judge(raw, spec)


class CycleFactory:
    def __init__(self, settings: Settings, stores: Stores, root: Path) -> None:
        self.settings, self.stores, self.root = settings, stores, root
        self.count = 0

    def project(self, name: str = "probe-dash") -> tuple[ProjectRef, Path]:
        repo = self.root / name
        if not repo.exists():
            make_repo(self.root, name)
            with self.stores.ops_session() as session:
                ops.create_project(session, ProjectCreate(name=name, repo_url=str(repo)))
        return ProjectRef(name, str(repo)), repo

    def make(
        self,
        *,
        hypothesis: str = "Fusing the probe halves the time",
        verdict: str = "faster",
        state: str = "awaiting_review",
        with_pr: bool = True,
        keep_worktree: bool = False,
        log_text: str | None = "probe started\nprobe finished\n",
        project: str = "probe-dash",
        result: dict[str, Any] | None = None,
        published: bool = False,
        gpu_seconds: float = 1.5,
        finished_at: datetime | None = None,
    ) -> Made:
        """A cycle as the commit and publish steps leave it. `result` is the judged result it
        committed (its verdict and headline are the cycle's); `published` writes the pull
        request's title and body as the publish step does (else a placeholder); its job used
        `gpu_seconds` and finished at `finished_at` (now by default)."""
        ref, repo = self.project(project)
        self.count += 1
        # The default: a fixed result with a small stand-in plot; a given one is drawn.
        plot = PLOT if result is None else report.render_plot(result)
        if result is None:
            result = result_for()
            result["verdict"] = verdict
            shown = {
                "ratio": 0.8,
                "ci_low": 0.75,
                "ci_high": 0.86,
                "accuracy_pass": True,
                "device": "cpu-test",
            }
        else:
            verdict, shown = str(result["verdict"]), headline(result)
        with self.stores.ops_session() as session:
            cycle = Cycle(
                project_id=ops.get_project(session, ref.name).id,
                state=state,
                experiment=str(result.get("experiment") or "probe"),
                parameters=dict(result.get("parameters") or {"sleep_s": 0.05 * self.count}),
                hypothesis=hypothesis,
                changed_hypothesis=CHANGES,
                verdict=verdict,
                headline=shown,
                gpu_seconds=gpu_seconds,
            )
            session.add(cycle)
            session.flush()
            cycle_id = cycle.id
            if log_text is not None:
                log = self.root / f"job-{cycle_id}.log"
                log.write_text(log_text)
                job = Job(
                    project_id=cycle.project_id,
                    cycle_id=cycle_id,
                    experiment=cycle.experiment or "probe",
                    queue="gpu.cpu",
                    state="succeeded",
                    log_path=str(log),
                    result=result,
                    gpu_seconds=gpu_seconds,
                    finished_at=finished_at or utcnow(),
                )
                session.add(job)
                session.flush()
        branch = f"autopilot/{ref.name}/{cycle_id}-probe"
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
        subprocess.run([*git, "checkout", "-q", "-b", branch, "main"], check=True)
        directory = repo / report.results_dir(str(cycle_id))
        directory.mkdir(parents=True)
        (directory / "result.json").write_text(json.dumps(result))
        (directory / "REPORT.md").write_text(
            report.render_markdown(
                result,
                report.ReportContext(
                    cycle_id=str(cycle_id), project=ref.name, hypothesis=hypothesis, changes=CHANGES
                ),
            )
        )
        (directory / "plot.svg").write_text(plot)
        subprocess.run([*git, "add", "results"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"cycle {cycle_id}"], check=True)
        sha = subprocess.run(
            [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
        subprocess.run([*git, "checkout", "-q", "main"], check=True)
        with self.stores.ops_session() as session:
            row = session.get(Cycle, cycle_id)
            assert row is not None
            row.branch, row.commit_sha = branch, sha
            session.flush()
            session.expunge(row)
        pr_number = pr_url = None
        if with_pr:
            forge = LocalForge(self.settings, self.stores)
            bare = forge.remote_url(ref)
            subprocess.run([*git, "push", "-q", bare, branch], check=True)
            title, body = f"cycle {cycle_id}", "body"
            if published:
                where = links(row, ref, forge, self.settings.dashboard_base_url)
                title, body = pr_title(row), pr_body(row, ref, result, where)
            pr = forge.open_pull_request(ref, branch, "main", title, body)
            pr_number, pr_url = pr.number, pr.url
        evidence = Evidence(
            cycle_id=str(cycle_id),
            commit=sha,
            pr_url=pr_url,
            result_path=f"results/{cycle_id}/result.json",
        )
        with self.stores.memory_session() as msession:
            finding = memory.create(
                msession,
                FindingCreate(
                    project=ref.name,
                    kind="verdict",
                    statement=f"probe (sleep_s={0.05 * self.count:g}): {verdict}, ratio 0.800",
                    hypothesis=hypothesis,
                    device_kind="cpu",
                    source=pr_url or "local",
                    source_status="verified",
                    evidence=evidence,
                    metrics={"ratio": 0.8},
                ),
                "cycle",
            )
            ids = [finding.id]
        with self.stores.ops_session() as session:
            cycle = session.get(Cycle, cycle_id)
            assert cycle is not None
            cycle.pr_number, cycle.pr_url, cycle.finding_ids = pr_number, pr_url, ids
        # The control host holds the cycle's commit in the project's mirror.
        GitWork(self.settings).fetch(ref.name, str(repo))
        if keep_worktree:
            # The files are edited in a checkout after the commit: the dashboard must read the
            # commit, never a directory (lesson 9).
            subprocess.run([*git, "checkout", "-q", branch], check=True)
            (directory / "REPORT.md").write_text("# Forged\n\nwritten after the commit\n")
            (directory / "plot.svg").write_text("<svg><script>forged()</script></svg>")
        return Made(cycle_id, ref, ids, repo)


@pytest.fixture
def cycles(settings: Settings, stores: Stores, tmp_path: Path) -> CycleFactory:
    return CycleFactory(settings, stores, tmp_path / "repos")
