"""A project whose repository lives on a git server (`git daemon`, the git:// protocol) runs a
whole cycle to review on the embedded defaults: nothing reads the repository from a path."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.integration.queue.conftest import Workers, make_repo
from tests.support import GitDaemon, bearer, wait_for


def test_a_project_on_a_git_url_runs_a_cycle_to_review(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    settings = workers.settings
    served = tmp_path / "served"
    served.mkdir()
    work = make_repo(tmp_path, "remote-lab")
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(served / "lab.git")], check=True)
    shutil.rmtree(work)  # only the server has the repository now
    daemon = GitDaemon(served)
    try:
        with stores.ops_session() as session:
            ops.create_project(
                session, ProjectCreate(name="remote-lab", repo_url=daemon.url("lab.git"))
            )
            _, token = ops.create_token(session, "ci", ["trigger"])
        workers.start("control", "control", "--beat")
        workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
        with TestClient(create_app(settings, stores)) as client:
            made = client.post(
                "/api/v1/cycles", json={"project": "remote-lab"}, headers=bearer(token)
            )
            assert made.status_code == 201, made.text
            cycle_id = made.json()["id"]

            def ended() -> dict | None:  # type: ignore[type-arg]
                body = client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token)).json()
                return body if body["state"] in ("awaiting_review", "failed") else None

            cycle = wait_for(ended, timeout=180)
        assert cycle["state"] == "awaiting_review", (cycle, workers.logs())
        assert cycle["pr_url"] and cycle["verdict"]
        served_head = subprocess.run(
            ["git", "--git-dir", str(served / "lab.git"), "rev-parse", "main"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        # the cycle's branch, on the local forge, starts from the commit the server has
        bare = settings.state_dir.absolute() / "forge" / "remote-lab.git"
        ancestry = subprocess.run(
            [
                "git",
                "--git-dir",
                str(bare),
                "merge-base",
                "--is-ancestor",
                served_head,
                cycle["branch"],
            ],
            check=False,
        )
        assert ancestry.returncode == 0
    finally:
        daemon.stop()
