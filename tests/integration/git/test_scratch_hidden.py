"""Hidden paths are absent from the agent's scratch clone, in its files and in its git objects,
and the agent's work comes back on the real base with them in place."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from app.agents import workspace
from app.agents.workspace import Workspace
from app.git.exceptions import AgentWorkRefused
from app.git.work import GitWork
from tests.integration.forge.gitrepo import commit_to, git, make_origin, plain_settings

SECRET = "hold-out-label-7f3a91"
HIDDEN = ("holdout",)


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    origin = make_origin(tmp_path)
    # In the base and in an earlier commit of its history: a clone of the base holds both.
    commit_to(origin, tmp_path, "main", "holdout/labels.json", f'["{SECRET}-old"]\n')
    commit_to(origin, tmp_path, "main", "holdout/labels.json", f'["{SECRET}"]\n')
    return origin


@pytest.fixture
def work(tmp_path: Path) -> GitWork:
    return GitWork(plain_settings(tmp_path), push_attempts=3, push_backoff_s=0.01)


def every_object(repo: Path) -> str:
    """The content of every object the clone holds, loose or packed, reachable or not."""
    return subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode(errors="replace")


def test_the_clone_holds_no_hidden_file_or_object_and_the_work_returns_on_the_base(
    work: GitWork, origin: Path, tmp_path: Path
) -> None:
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "hidden")
    space = Workspace(tmp_path / "agent")
    space.reset()
    start = work.scratch_clone(br, space.repo, HIDDEN)

    assert start != br.base_sha
    assert not (space.repo / "holdout").exists()
    assert (space.repo / "src" / "kernel.py").exists()  # the rest of the base is there
    assert SECRET not in every_object(space.repo)
    assert git(space.repo, "rev-list", "--all", "--count") == "1"  # no history to dig in

    (space.repo / "src" / "kernel.py").write_text("def kernel(x):\n    return 3 * x\n")
    bundle = workspace.pack(
        space,
        start,
        name=f"t-{os.getpid()}",
        author=("a", "a@b"),
        message="Triple it",
        enabled=False,
    )
    head = work.take_agent_work(br, bundle, HIDDEN)

    mirror = br.mirror
    assert git(mirror, "rev-parse", f"{head}^") == br.base_sha  # one commit on the base
    assert SECRET in git(mirror, "show", f"{head}:holdout/labels.json")
    assert "3 * x" in git(mirror, "show", f"{head}:src/kernel.py")
    assert git(mirror, "log", "-1", "--format=%s", head) == "Triple it"
    changed = git(mirror, "diff", "--name-only", br.base_sha, head).split()
    assert changed == ["src/kernel.py"]
    assert work.tip(br) == head


def test_a_file_planted_under_a_hidden_path_is_refused(
    work: GitWork, origin: Path, tmp_path: Path
) -> None:
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "plant")
    space = Workspace(tmp_path / "agent-plant")
    space.reset()
    start = work.scratch_clone(br, space.repo, HIDDEN)
    (space.repo / "holdout").mkdir()
    (space.repo / "holdout" / "labels.json").write_text('["what the agent wants"]\n')
    bundle = workspace.pack(
        space, start, name=f"t-{os.getpid()}", author=("a", "a@b"), message="m", enabled=False
    )
    with pytest.raises(AgentWorkRefused, match="holdout/labels.json"):
        work.take_agent_work(br, bundle, HIDDEN)
    assert work.tip(br) == br.base_sha


def test_no_change_leaves_the_branch_at_its_base(
    work: GitWork, origin: Path, tmp_path: Path
) -> None:
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "none")
    space = Workspace(tmp_path / "agent-none")
    space.reset()
    start = work.scratch_clone(br, space.repo, HIDDEN)
    bundle = workspace.pack(
        space, start, name=f"t-{os.getpid()}", author=("a", "a@b"), message="m", enabled=False
    )
    assert bundle is None
    assert work.take_agent_work(br, bundle, HIDDEN) == br.base_sha
