"""A project's repository on a real git server (`git daemon` on loopback): the commit a cycle
starts from and its autopilot.toml are read through the control host's mirror, never from a
path, and each failure says what went wrong."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.forge import service as forge_service
from app.forge.base import ProjectRef
from app.git import mirror
from app.git.exceptions import BaseBranchMissing, FetchFailed, InvalidRef
from app.git.work import GitWork
from app.projects import service as ops
from app.projects.config import ConfigError
from app.settings import Settings
from tests.integration.queue.conftest import make_repo
from tests.support import GitDaemon, bearer, free_port


def git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[GitDaemon, Path]]:
    """A research repository `lab.git` served by git daemon, and a working clone of it."""
    root = tmp_path / "served"
    root.mkdir()
    work = make_repo(tmp_path, "lab")
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / "lab.git")], check=True)
    git(work, "remote", "add", "served", str(root / "lab.git"))
    daemon = GitDaemon(root)
    try:
        yield daemon, work
    finally:
        daemon.stop()


def ref_for(url: str, branch: str = "main") -> ProjectRef:
    return ProjectRef(name="lab", repo_url=url, default_branch=branch)


def test_base_commit_and_config_come_from_the_git_server(
    served: tuple[GitDaemon, Path], settings: Settings, stores: Stores
) -> None:
    daemon, work = served
    forge = forge_service.forge_for(settings, stores)
    sha, config = forge_service.config_at_base(
        GitWork(settings), forge, ref_for(daemon.url("lab.git"))
    )
    assert sha == git(work, "rev-parse", "HEAD")
    assert config.project.name == "lab"

    # A commit pushed to the lab's server reaches the next cycle (the forge's base follows it).
    (work / "autopilot.toml").write_text(
        (work / "autopilot.toml").read_text().replace('gpu_kind = "cpu"', 'gpu_kind = "cpu"\n# v2')
    )
    git(work, "commit", "-qam", "v2")
    git(work, "push", "-q", "served", "main")
    sha2, _ = forge_service.config_at_base(GitWork(settings), forge, ref_for(daemon.url("lab.git")))
    assert sha2 == git(work, "rev-parse", "HEAD") != sha


def test_an_unreachable_server_is_a_transient_fetch_error_with_gits_last_line(
    settings: Settings, stores: Stores
) -> None:
    url = f"git://127.0.0.1:{free_port()}/lab.git"  # nothing listens there
    with pytest.raises(FetchFailed) as caught:
        GitWork(settings).read_at("lab", url, "main", "autopilot.toml")
    assert caught.value.status == 503  # Unavailable: the cycle retries it with backoff
    assert url in caught.value.detail
    assert "connection refused" in caught.value.detail.lower()
    assert "\n" not in caught.value.detail


def test_a_commit_without_autopilot_toml_names_the_file_and_the_commit(
    served: tuple[GitDaemon, Path], settings: Settings, stores: Stores
) -> None:
    daemon, work = served
    git(work, "checkout", "-q", "-b", "bare-code")
    git(work, "rm", "-q", "autopilot.toml")
    git(work, "commit", "-qm", "no config")
    git(work, "push", "-q", "served", "bare-code")
    head = git(work, "rev-parse", "HEAD")
    forge = forge_service.forge_for(settings, stores)
    with pytest.raises(ConfigError) as caught:
        forge_service.config_at_base(
            GitWork(settings), forge, ref_for(daemon.url("lab.git"), "bare-code")
        )
    assert "autopilot.toml" in caught.value.detail and head[:12] in caught.value.detail


def test_a_branch_the_server_does_not_have_is_named(
    served: tuple[GitDaemon, Path], settings: Settings
) -> None:
    daemon, _ = served
    with pytest.raises(BaseBranchMissing, match="'trunk'"):
        forge_service.config_at_url(GitWork(settings), daemon.url("lab.git"), "trunk")
    sha, config = forge_service.config_at_url(GitWork(settings), daemon.url("lab.git"), "main")
    assert len(sha) == 40 and config.project.name == "lab"


@pytest.mark.parametrize(
    "url",
    [
        "https://ghp_secret0123456789@github.com/lab/repo.git",
        "https://person:hunter2-secret@git.lab.example/repo.git",
        "git://someone@127.0.0.1/lab.git",
    ],
)
def test_credentials_in_a_repo_url_are_refused_at_registration(
    settings: Settings, stores: Stores, url: str
) -> None:
    with stores.ops_session() as session:
        _, admin = ops.create_token(session, "admin", ["admin"])
    with TestClient(create_app(settings, stores)) as client:
        answer = client.post(
            "/api/v1/projects", json={"name": "lab", "repo_url": url}, headers=bearer(admin)
        )
        assert answer.status_code == 422, answer.text
        assert "credentials" in answer.text and "repo_url" in answer.text
        assert "secret" not in answer.text  # the refused URL is not echoed back
        listed = client.get("/api/v1/projects", headers=bearer(admin)).json()
    assert listed == []


def test_a_commit_force_pushed_away_is_refused_when_a_host_fetches_it(
    served: tuple[GitDaemon, Path], settings: Settings
) -> None:
    daemon, work = served
    git(work, "checkout", "-q", "-b", "autopilot/lab/1-x")
    (work / "notes.txt").write_text("candidate\n")
    git(work, "add", "notes.txt")
    git(work, "commit", "-qm", "candidate")
    git(work, "push", "-q", "served", "autopilot/lab/1-x")
    candidate = git(work, "rev-parse", "HEAD")
    host = GitWork(settings)  # a GPU host's own mirror cache
    cache, sha = mirror.fetch_commit(
        host, "lab", daemon.url("lab.git"), "autopilot/lab/1-x", candidate
    )
    exported = mirror.export(host, cache, sha, settings.state_dir / "jobs" / "1" / "src")
    assert (exported / "notes.txt").read_text() == "candidate\n"
    assert not (exported / ".git").exists()
    # the branch is rewritten on the server: the job's commit is gone from it
    git(work, "reset", "-q", "--hard", "HEAD~1")
    (work / "notes.txt").write_text("rewritten\n")
    git(work, "add", "notes.txt")
    git(work, "commit", "-qm", "rewritten")
    git(work, "push", "-q", "--force", "served", "autopilot/lab/1-x")
    with pytest.raises(InvalidRef, match=f"{candidate[:12]} is no longer on branch"):
        mirror.fetch_commit(host, "lab", daemon.url("lab.git"), "autopilot/lab/1-x", candidate)


def test_an_export_carries_no_bytecode_even_where_a_commit_holds_some(
    served: tuple[GitDaemon, Path], settings: Settings
) -> None:
    daemon, work = served
    git(work, "checkout", "-q", "-b", "autopilot/lab/2-x")
    planted = work / "probe" / "__pycache__" / "main.cpython-311.pyc"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"planted bytecode")
    (work / "stray.pyc").write_bytes(b"planted bytecode")
    git(work, "add", "-f", "probe/__pycache__/main.cpython-311.pyc", "stray.pyc")
    git(work, "commit", "-qm", "a person committed bytecode on the base")
    git(work, "push", "-q", "served", "autopilot/lab/2-x")
    host = GitWork(settings)
    cache, sha = mirror.fetch_commit(
        host, "lab", daemon.url("lab.git"), "autopilot/lab/2-x", git(work, "rev-parse", "HEAD")
    )
    exported = mirror.export(host, cache, sha, settings.state_dir / "jobs" / "2" / "src")
    assert (exported / "probe" / "main.py").exists()  # the sources are there
    assert not (exported / "stray.pyc").exists()
    assert not list(exported.rglob("__pycache__"))


def test_the_commits_own_attributes_cannot_drop_or_rewrite_exported_files(
    served: tuple[GitDaemon, Path], settings: Settings
) -> None:
    daemon, work = served
    git(work, "checkout", "-q", "-b", "autopilot/lab/3-x")
    (work / ".gitattributes").write_text("probe/main.py export-ignore\nnotes.txt export-subst\n")
    (work / "notes.txt").write_text("commit $Format:%H$\n")
    git(work, "add", ".gitattributes", "notes.txt")
    git(work, "commit", "-qm", "attributes that would change the export")
    git(work, "push", "-q", "served", "autopilot/lab/3-x")
    host = GitWork(settings)
    cache, sha = mirror.fetch_commit(
        host, "lab", daemon.url("lab.git"), "autopilot/lab/3-x", git(work, "rev-parse", "HEAD")
    )
    exported = mirror.export(host, cache, sha, settings.state_dir / "jobs" / "3" / "src")
    assert (exported / "probe" / "main.py").exists()
    assert (exported / "notes.txt").read_text() == "commit $Format:%H$\n"
