"""GitWork against real git: mirrors, worktrees, commits, pushes, a moving base, bad input."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import SecretStr

from app.forge import git as gitmod
from app.forge.exceptions import (
    BaseBranchMissing,
    GitFailed,
    InvalidRef,
    ProtectedPathChanged,
    PushFailed,
    PushRejected,
    TransportNotAllowed,
)
from app.forge.git import GitWork
from app.forge.gitrunner import GitRunner
from tests.integration.forge.gitrepo import commit_to, git, make_origin, plain_settings

RESULTS = ["results/c0ffee01/"]


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    return make_origin(tmp_path)


@pytest.fixture
def work(tmp_path: Path) -> GitWork:
    return GitWork(plain_settings(tmp_path), push_attempts=3, push_backoff_s=0.01)


def test_prepare_commit_push_round_trip(work: GitWork, origin: Path, tmp_path: Path) -> None:
    wt = work.prepare_worktree("spectral", str(origin), "main", "c0ffee01-aaaa", "Fuse the FFT")
    assert wt.branch == "autopilot/spectral/c0ffee01-fuse-the-fft"
    assert wt.path == tmp_path / "state" / "worktrees" / "spectral" / "c0ffee01"
    assert (tmp_path / "state" / "repos" / "spectral.git" / "HEAD").exists()
    assert wt.base_sha == git(origin, "rev-parse", "main")

    (wt.path / "src" / "kernel.py").write_text("def kernel(x):\n    return x + x\n")
    (wt.path / "results" / "c0ffee01").mkdir(parents=True)
    (wt.path / "results" / "c0ffee01" / "result.json").write_text("{}\n")
    sha = work.commit(wt, "Fuse the FFT", allowed=RESULTS)
    assert work.commit(wt, "Fuse the FFT", allowed=RESULTS) == sha  # nothing new: same commit
    assert git(wt.path, "log", "-1", "--format=%an <%ae>|%cn") == (
        "Autopilot Test <autopilot@test.example>|Autopilot Test"
    )

    assert work.push(wt, str(origin), allowed=RESULTS) == sha
    assert work.push(wt, str(origin), allowed=RESULTS) == sha  # idempotent
    assert git(origin, "rev-parse", wt.branch) == sha
    assert work.remote_head(str(origin), wt.branch) == sha

    again = work.prepare_worktree("spectral", str(origin), "main", "c0ffee01-aaaa", "Fuse the FFT")
    assert again == wt
    work.remove_worktree(wt)
    assert not wt.path.exists()
    # After a crash that lost the checkout, the branch (with its commit) comes back.
    back = work.prepare_worktree("spectral", str(origin), "main", "c0ffee01-aaaa", "Fuse the FFT")
    assert git(back.path, "rev-parse", "HEAD") == sha


def test_base_that_moves_under_a_running_cycle(work: GitWork, origin: Path, tmp_path: Path) -> None:
    wt = work.prepare_worktree("spectral", str(origin), "main", "c0ffee01", "tile")
    started_on = wt.base_sha
    moved = commit_to(origin, tmp_path, "main", "src/other.py", "X = 1\n")
    # The cycle is resumed (say after a crash): it keeps the base it measured against.
    resumed = work.prepare_worktree("spectral", str(origin), "main", "c0ffee01", "tile")
    assert resumed.base_sha == started_on != moved
    (wt.path / "src" / "kernel.py").write_text("def kernel(x):\n    return 2 * x\n")
    sha = work.commit(wt, "tile")
    work.push(wt, str(origin))
    assert git(origin, "rev-parse", wt.branch) == sha
    assert work.remote_head(str(origin), "main") == moved
    assert git(origin, "merge-base", "main", wt.branch) == started_on


@pytest.mark.parametrize(
    ("path", "action"),
    [
        ("experiments/harness/judge.py", "edit"),
        ("experiments/harness/judge.py", "delete"),
        ("experiments/harness/new_judge.py", "add"),
        ("eval/score.py", "edit"),
        ("autopilot.toml", "edit"),
        ("results/older/result.json", "add"),
    ],
)
def test_protected_paths_are_refused(work: GitWork, origin: Path, path: str, action: str) -> None:
    wt = work.prepare_worktree("spectral", str(origin), "main", "c0ffee01", "cheat")
    target = wt.path / path
    if action == "delete":
        target.unlink()
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("TOLERANCE = 1.0  # the agent makes its result look better\n")
    with pytest.raises(ProtectedPathChanged) as caught:
        work.commit(wt, "cheat", allowed=RESULTS)
    assert path in caught.value.detail
    assert caught.value.extra["paths"] == [path]
    assert git(wt.path, "rev-parse", "HEAD") == wt.base_sha  # nothing was committed


def test_agent_commit_to_the_harness_is_refused_at_push(work: GitWork, origin: Path) -> None:
    wt = work.prepare_worktree("spectral", str(origin), "main", "c0ffee01", "sneaky")
    (wt.path / "experiments" / "harness" / "judge.py").write_text("TOLERANCE = 1.0\n")
    git(wt.path, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qam", "agent")
    # The agent committed by itself; the commit gate sees the index equal HEAD, but the
    # protected check compares with the base, so both commit and push refuse it.
    with pytest.raises(ProtectedPathChanged):
        work.commit(wt, "x")
    with pytest.raises(ProtectedPathChanged):
        work.push(wt, str(origin))
    assert work.remote_head(str(origin), wt.branch) is None


def test_unprotected_change_and_own_results_pass(work: GitWork, origin: Path) -> None:
    wt = work.prepare_worktree("spectral", str(origin), "main", "c0ffee01", "ok")
    (wt.path / "src" / "kernel.py").write_text("def kernel(x):\n    return x << 1\n")
    (wt.path / "results" / "c0ffee01").mkdir(parents=True)
    (wt.path / "results" / "c0ffee01" / "REPORT.md").write_text("# ok\n")
    git(wt.path, "add", "-A")
    check = work.check_protected(wt, allowed=RESULTS)
    assert check.violations == []
    assert "experiments/harness/judge.py" in check.base_hashes
    assert check.base_hashes == check.candidate_hashes
    work.commit(wt, "ok", allowed=RESULTS)


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c touch% /tmp/autopilot-pwned",
        "fd::3",
        "-uhttps://example.com/x.git",
        "--upload-pack=touch /tmp/x",
        "relative/path",
        "https://example.com/x.git\nmore",
    ],
)
def test_disallowed_transports_are_refused(work: GitWork, url: str) -> None:
    with pytest.raises(TransportNotAllowed):
        work.fetch("spectral", url)
    with pytest.raises(TransportNotAllowed):
        work.prepare_worktree("spectral", url, "main", "c0ffee01", "x")


def test_git_itself_refuses_ext_even_if_validation_were_bypassed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    runner = GitRunner(author=("a", "a@b"))
    with pytest.raises(GitFailed):
        runner.run(["ls-remote", "--end-of-options", f"ext::sh -c touch% {marker}"], tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "base", ["a..b", "-main", "--upload-pack=x", "ma in", "main~1", "x@{1}", ""]
)
def test_bad_base_refs_are_refused(work: GitWork, origin: Path, base: str) -> None:
    with pytest.raises(InvalidRef):
        work.prepare_worktree("spectral", str(origin), base, "c0ffee01", "x")


def test_missing_base_branch(work: GitWork, origin: Path) -> None:
    with pytest.raises(BaseBranchMissing, match="does not exist"):
        work.prepare_worktree("spectral", str(origin), "develop", "c0ffee01", "x")


def test_remote_that_rejects_the_push(tmp_path: Path, origin: Path) -> None:
    hook = origin / "hooks" / "pre-receive"
    hook.write_text(
        "#!/bin/sh\necho 'branch policy: autopilot branches are not allowed' >&2\nexit 1\n"
    )
    hook.chmod(0o755)
    sleeps: list[float] = []
    work = GitWork(
        plain_settings(tmp_path), push_attempts=3, push_backoff_s=0.01, sleep=sleeps.append
    )
    wt = work.prepare_worktree("spectral", str(origin), "main", "c0ffee01", "x")
    (wt.path / "src" / "kernel.py").write_text("pass\n")
    work.commit(wt, "x")
    with pytest.raises(PushRejected) as caught:
        work.push(wt, str(origin))
    assert wt.branch in caught.value.detail
    assert "pre-receive hook declined" in caught.value.detail
    assert "branch policy" in caught.value.detail
    assert sleeps == []  # a refusal is not retried
    assert caught.value.status == 502 and caught.value.slug == "push-rejected"


def test_transient_push_failure_is_retried_and_credentials_never_leak(
    tmp_path: Path, origin: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = "ghp_supersecretTOKEN1234567890"
    sleeps: list[float] = []
    work = GitWork(
        plain_settings(tmp_path),
        token=SecretStr(token),
        push_attempts=3,
        push_backoff_s=0.01,
        sleep=sleeps.append,
    )
    wt = work.prepare_worktree("spectral", str(origin), "main", "c0ffee01", "x")
    (wt.path / "src" / "kernel.py").write_text("pass\n")
    work.commit(wt, "x")
    # Nothing listens on port 1: connection refused, a transient failure.
    url = f"https://x-access-token:{token}@127.0.0.1:1/lab/research.git"
    with pytest.raises(PushFailed) as caught:
        work.push(wt, url)
    assert sleeps == [0.01, 0.02]
    assert "failed 3 times" in caught.value.detail
    assert token not in caught.value.detail and token not in str(caught.value)
    # The token as a header (no credentials in the URL) does not leak either.
    with pytest.raises(PushFailed) as second:
        work.push(wt, "https://127.0.0.1:1/lab/research.git")
    assert token not in str(second.value)
    with pytest.raises(GitFailed) as third:
        work.fetch("spectral", url)
    assert token not in str(third.value)
    assert token not in caplog.text
    assert "127.0.0.1:1" in caplog.text or caplog.records  # something was logged at all


def test_branch_names() -> None:
    assert gitmod.branch_name("proj", "C0FFEE01-2222-3333", "Use TF32 / tensor cores!") == (
        "autopilot/proj/c0ffee01-use-tf32-tensor-cores"
    )
    for project in ("-x", "a..b", "A B", "../etc"):
        with pytest.raises(InvalidRef):
            gitmod.branch_name(project, "c0ffee01", "x")
    for cycle in ("../x", "-1", "a b", ""):
        with pytest.raises(InvalidRef):
            gitmod.branch_name("proj", cycle, "x")
