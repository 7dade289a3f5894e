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
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.cycles.models import Cycle
from app.db import Stores
from app.forge.base import ProjectRef
from app.forge.local import LocalForge
from app.git.work import GitWork
from app.jobs.models import Job
from app.memory import service as memory
from app.memory.schemas import Evidence, FindingCreate
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.reports import cycle as report
from app.settings import Settings
from tests.integration.queue.conftest import make_repo

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
    ) -> Made:
        ref, repo = self.project(project)
        self.count += 1
        result = result_for()
        result["verdict"] = verdict
        with self.stores.ops_session() as session:
            cycle = Cycle(
                project_id=ops.get_project(session, ref.name).id,
                state=state,
                experiment="probe",
                parameters={"sleep_s": 0.05 * self.count},
                hypothesis=hypothesis,
                verdict=verdict,
                headline={
                    "ratio": 0.8,
                    "ci_low": 0.75,
                    "ci_high": 0.86,
                    "accuracy_pass": True,
                    "device": "cpu-test",
                },
                gpu_seconds=1.5,
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
                    experiment="probe",
                    queue="gpu.cpu",
                    state="succeeded",
                    log_path=str(log),
                    result=result,
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
                    cycle_id=str(cycle_id),
                    project=ref.name,
                    hypothesis=hypothesis,
                    changes="probe: fused loop",
                ),
            )
        )
        (directory / "plot.svg").write_text(PLOT)
        subprocess.run([*git, "add", "results"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"cycle {cycle_id}"], check=True)
        sha = subprocess.run(
            [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
        subprocess.run([*git, "checkout", "-q", "main"], check=True)
        pr_number = pr_url = None
        if with_pr:
            forge = LocalForge(self.settings, self.stores)
            bare = forge.remote_url(ref)
            subprocess.run([*git, "push", "-q", bare, branch], check=True)
            pr = forge.open_pull_request(ref, branch, "main", f"cycle {cycle_id}", "body")
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
            cycle.branch, cycle.commit_sha, cycle.pr_number, cycle.pr_url = (
                branch,
                sha,
                pr_number,
                pr_url,
            )
            cycle.finding_ids = ids
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
