"""A whole cycle through the REST API and real workers: trigger → ... → awaiting_review."""

from __future__ import annotations

import subprocess
from pathlib import Path

from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.memory import service as memory
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.integration.queue.conftest import Workers, make_repo
from tests.support import bearer, wait_for


def test_cycle_reaches_review_with_branch_commit_pr_and_findings(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    settings = workers.settings
    repo = make_repo(tmp_path, "probe-cycle")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="probe-cycle", repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
        _, reviewer = ops.create_token(session, "rev", ["review"])
    workers.start("control", "control", "--beat")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    with TestClient(create_app(settings, stores)) as client:
        headers = {**bearer(token), "Idempotency-Key": "k-1"}
        first = client.post("/api/v1/cycles", json={"project": "probe-cycle"}, headers=headers)
        assert first.status_code == 201, first.text
        again = client.post("/api/v1/cycles", json={"project": "probe-cycle"}, headers=headers)
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        cycle_id = first.json()["id"]

        def ended() -> dict | None:  # type: ignore[type-arg]
            body = client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token)).json()
            return (
                body if body["state"] in ("awaiting_review", "failed", "skipped_repeat") else None
            )

        cycle = wait_for(ended, timeout=180)
        assert cycle["state"] == "awaiting_review", (cycle, workers.logs())
        assert [s["name"] for s in cycle["steps"]][:2] == ["planned", "preparing"]
        assert cycle["parameters"] == {"sleep_s": 0.05, "grandchild": 0}  # first sweep point
        listed = client.get("/api/v1/cycles", headers=bearer(token)).json()
        assert [c["id"] for c in listed] == [cycle_id]

    # The branch with the report is on the local forge's bare repository.
    bare = settings.state_dir.absolute() / "forge" / "probe-cycle.git"
    files = subprocess.run(
        ["git", "--git-dir", str(bare), "ls-tree", "-r", "--name-only", cycle["branch"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in ("result.json", "REPORT.md", "plot.svg"):
        assert f"results/{cycle_id}/{name}" in files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    assert cycle["pr_url"] and cycle["pr_number"] == 1
    with stores.memory_session() as session:
        findings = [memory.get(session, fid) for fid in cycle["finding_ids"]]
    assert findings and all(f.status == "proposed" for f in findings)
    assert findings[0].fingerprint == cycle["fingerprint"]

    # Approval validates the findings and notes the decision on the PR; the same point again
    # is then a repeat without a changed hypothesis, and is skipped.
    with TestClient(create_app(settings, stores)) as client:
        denied = client.post(
            f"/api/v1/cycles/{cycle_id}/review", headers=bearer(token), json={"decision": "approve"}
        )
        assert denied.status_code == 403
        decided = client.post(
            f"/api/v1/cycles/{cycle_id}/review",
            headers=bearer(reviewer),
            json={"decision": "approve", "note": "numbers look right"},
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["state"] == "approved"
        again = client.post(
            f"/api/v1/cycles/{cycle_id}/review",
            headers=bearer(reviewer),
            json={"decision": "reject", "note": "changed my mind"},
        )
        assert again.status_code == 409
        repeat = client.post(
            "/api/v1/cycles",
            headers=bearer(token),
            json={
                "project": "probe-cycle",
                "experiment": "probe",
                "parameters": cycle["parameters"],
            },
        )
        repeat_id = repeat.json()["id"]
        skipped = wait_for(
            lambda: (
                (body := client.get(f"/api/v1/cycles/{repeat_id}", headers=bearer(token)).json())[
                    "state"
                ]
                != "planned"
                and body
            )
        )
        assert skipped["state"] == "skipped_repeat"
        assert skipped["repeat_of"] == cycle["finding_ids"][0]
    with stores.memory_session() as session:
        assert memory.get(session, cycle["finding_ids"][0]).status == "validated"
    from app.forge.base import ProjectRef
    from app.forge.local import LocalForge

    comments = LocalForge(settings, stores).comments(
        ProjectRef("probe-cycle", str(repo)), cycle["pr_number"]
    )
    assert any("numbers look right" in c for c in comments)


def test_control_crash_between_commit_and_publish_gives_one_pr(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    settings = workers.settings
    repo = make_repo(tmp_path, "probe-crash")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="probe-crash", repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    crashing = workers.start("control", "control", exit_after_step="committing")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    with TestClient(create_app(settings, stores)) as client:
        cycle_id = client.post(
            "/api/v1/cycles", json={"project": "probe-crash"}, headers=bearer(token)
        ).json()["id"]
        # The control worker dies right after the commit step recorded its transition.
        assert crashing.wait(timeout=180) == 137
        workers.kill("control")  # what it left in its process group goes too
        state = client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token)).json()
        assert state["state"] == "publishing" and state["commit_sha"]
        # A fresh control worker with the reaper notices the stalled cycle and finishes it.
        workers.start("control2", "control", "--beat")

        def reviewed() -> dict | None:  # type: ignore[type-arg]
            body = client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token)).json()
            return body if body["state"] != "publishing" else None

        cycle = wait_for(reviewed, timeout=120)
    assert cycle["state"] == "awaiting_review", (cycle, workers.logs())
    assert cycle["commit_sha"] == state["commit_sha"]  # not committed twice
    from app.forge.base import ProjectRef
    from app.forge.local import LocalForge

    prs = LocalForge(settings, stores).list_pull_requests(ProjectRef("probe-crash", str(repo)))
    assert len(prs) == 1


def test_trigger_flood_is_refused_beyond_the_limit(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    settings = workers.settings.model_copy(update={"max_live_cycles_per_project": 3})
    repo = make_repo(tmp_path, "probe-flood")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="probe-flood", repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    # No workers run: every cycle stays planned, which is what a flood looks like.
    with TestClient(create_app(settings, stores)) as client:
        codes = [
            client.post("/api/v1/cycles", json={"project": "probe-flood"}, headers=bearer(token))
            for _ in range(10)
        ]
        assert [r.status_code for r in codes] == [201] * 3 + [429] * 7
        problem = codes[-1].json()
        assert problem["type"].endswith("/too-many-cycles")
        assert "limit 3" in problem["detail"]
        unknown = client.post("/api/v1/cycles", json={"project": "nope"}, headers=bearer(token))
        assert unknown.status_code == 404
        listed = client.get("/api/v1/cycles", headers=bearer(token)).json()
    assert len(listed) == 3


def test_merge_revalidates_on_a_moved_base(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    settings = workers.settings
    repo = make_repo(tmp_path, "probe-merge")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="probe-merge", repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger", "review"])
    workers.start("control", "control")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    with TestClient(create_app(settings, stores)) as client:
        cycle_id = client.post(
            "/api/v1/cycles", json={"project": "probe-merge"}, headers=bearer(token)
        ).json()["id"]

        def state() -> dict:  # type: ignore[type-arg]
            return client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token)).json()  # type: ignore[no-any-return]

        cycle = wait_for(lambda: (c := state())["state"] == "awaiting_review" and c, timeout=180)
        # Someone pushes to the base while the PR waits for review.
        bare = settings.state_dir.absolute() / "forge" / "probe-merge.git"
        other = tmp_path / "other"
        subprocess.run(["git", "clone", "-q", str(bare), str(other)], check=True)
        (other / "NOTES.md").write_text("unrelated change\n")
        env = {
            "GIT_AUTHOR_NAME": "o",
            "GIT_AUTHOR_EMAIL": "o@x",
            "GIT_COMMITTER_NAME": "o",
            "GIT_COMMITTER_EMAIL": "o@x",
            "PATH": "/usr/bin:/bin",
        }
        for argv in (
            ["git", "add", "NOTES.md"],
            ["git", "commit", "-qm", "move base"],
            ["git", "push", "-q", "origin", "HEAD:main"],
        ):
            subprocess.run(argv, cwd=other, check=True, env=env)
        decided = client.post(
            f"/api/v1/cycles/{cycle_id}/review",
            headers=bearer(token),
            json={"decision": "approve", "merge": True},
        )
        assert decided.status_code == 200, decided.text
        merged = wait_for(
            lambda: next((s for s in state()["steps"] if s["name"] == "merge"), None), timeout=180
        )
        assert merged["status"] == "done", (merged, workers.logs())
        assert "re-validation" in merged["detail"]
        jobs_run = client.get("/api/v1/jobs", headers=bearer(token)).json()
    assert len(jobs_run) == 2  # the cycle's run and the re-validation on the moved base
    log = subprocess.run(
        ["git", "--git-dir", str(bare), "log", "--format=%s", "main"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "move base" in log and cycle["branch"] in log


def test_cycle_against_the_github_forge(workers: Workers, stores: Stores, tmp_path: Path) -> None:
    """The same cycle with forge=github: git pushes to the project's remote, the PR is opened
    through the GitHub REST API (a local server implementing it), and no token leaks."""
    from tests.integration.forge.github_fake import serve

    source = make_repo(tmp_path, "probe-gh")
    remote = tmp_path / "lab" / "research.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(remote)], check=True)
    secret = "ghp_test_" + "s3cr3t" * 6
    with stores.ops_session() as session:
        ops.create_project(
            session, ProjectCreate(name="probe-gh", repo_url=str(remote), forge="github")
        )
        _, token = ops.create_token(session, "ci", ["trigger"])
    with serve() as fake:
        fake.owner, fake.repo = "lab", "research"
        env = {
            "AUTOPILOT_FORGE": "github",
            "AUTOPILOT_GITHUB_TOKEN": secret,
            "AUTOPILOT_GITHUB_BASE_URL": fake.base_url,
        }
        workers.start("control", "control", env=env)
        workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0", env=env)
        with TestClient(create_app(workers.settings, stores)) as client:
            cycle_id = client.post(
                "/api/v1/cycles", json={"project": "probe-gh"}, headers=bearer(token)
            ).json()["id"]

            def ended() -> dict | None:  # type: ignore[type-arg]
                body = client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token)).json()
                return body if body["state"] in ("awaiting_review", "failed") else None

            cycle = wait_for(ended, timeout=180)
        assert cycle["state"] == "awaiting_review", (cycle, workers.logs())
        (pr,) = fake.pulls
        assert pr["head"]["ref"] == cycle["branch"] and cycle["pr_number"] == pr["number"]
        assert all(header.endswith(secret) for header in fake.auth_headers)
    # The body stands alone on GitHub: verdict, gate, table, the plot at the results commit,
    # the reproduce line and the dashboard link.
    body = pr["body"]
    blob = f"https://github.example/lab/research/blob/{cycle['commit_sha']}/results/{cycle_id}"
    for expected in (
        f"**Verdict: {cycle['verdict']}**, ratio ",
        "Accuracy gate: ",
        "| variant | baseline median | variant median |",
        f"]({blob}/plot.svg?raw=true)",
        f"[the whole report, REPORT.md]({blob}/REPORT.md)",
        "autopilot job submit --project probe-gh --experiment probe",
        f"/dashboard/cycles/{cycle_id})",
    ):
        assert expected in body, (expected, body)
    assert secret not in body
    files = subprocess.run(
        ["git", "--git-dir", str(remote), "ls-tree", "-r", "--name-only", cycle["branch"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert f"results/{cycle_id}/REPORT.md" in files and f"results/{cycle_id}/plot.svg" in files
    assert secret not in workers.logs()
    assert secret not in str(cycle)
