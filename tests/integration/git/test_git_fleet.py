"""GitWork's shortcuts for many cycles of one project at once (issue 18): later steps reuse the
cycle's branch without a fetch, concurrent fetches of one mirror share one, and cycles commit
side by side."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.git import runner as gitrunner
from app.git.runner import repo_lock, single_flight
from app.git.work import GitWork
from tests.integration.forge.gitrepo import commit_to, git, make_origin, plain_settings

RESULTS = ["results/"]


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    return make_origin(tmp_path)


@pytest.fixture
def work(tmp_path: Path) -> GitWork:
    return GitWork(plain_settings(tmp_path), push_attempts=1, push_backoff_s=0.01)


def test_a_known_base_reuses_the_branch_without_touching_the_remote(
    work: GitWork, origin: Path, tmp_path: Path
) -> None:
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "sweep")
    gone = tmp_path / "no-such-remote.git"  # a fetch from it would fail
    again = work.start_branch(
        "spectral", str(gone), "main", "c0ffee01", "sweep", base_sha=br.base_sha
    )
    assert again == br
    # A branch not made yet, at a base the mirror holds (the plan's fetch brought it): made
    # there, still without the remote.
    other = work.start_branch(
        "spectral", str(gone), "main", "c0ffee02", "sweep", base_sha=br.base_sha
    )
    assert other.branch != br.branch and other.base_sha == br.base_sha
    assert work.tip(other) == git(other.mirror, "rev-parse", other.ref) == br.base_sha
    # A base the mirror does not hold yet (a fresh control host) is fetched: from a remote
    # that is gone that fails, from the remote it makes the branch at the remote's base.
    moved = commit_to(origin, tmp_path, "main", "NEWS.md", "moved\n")
    with pytest.raises(Exception, match="cannot fetch"):
        work.start_branch("spectral", str(gone), "main", "c0ffee03", "sweep", base_sha=moved)
    third = work.start_branch("spectral", str(origin), "main", "c0ffee03", "sweep", base_sha=moved)
    assert third.base_sha == moved and work.tip(third) == moved


def test_a_fetch_sees_commits_pushed_before_it_was_asked(
    work: GitWork, origin: Path, tmp_path: Path
) -> None:
    first = work.start_branch("spectral", str(origin), "main", "c0ffee01", "sweep")
    moved = commit_to(origin, tmp_path, "main", "NEWS.md", "moved\n")
    second = work.start_branch("spectral", str(origin), "main", "c0ffee02", "sweep")
    assert second.base_sha == moved != first.base_sha


def test_single_flight_skips_only_a_run_that_began_after_the_ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "mirror.git"
    clock = iter([100.0, 101.0])  # asked, began
    monkeypatch.setattr(gitrunner.time, "time", lambda: next(clock))
    with single_flight(repo, "url-a") as needed:
        assert needed
    # Asked at 100.5, before the run that began at 101 finished: that run serves this caller.
    clock = iter([100.5])
    with single_flight(repo, "url-a") as needed:
        assert not needed
    # Asked after it began, or for another URL: fetch again.
    clock = iter([101.5, 102.0])
    with single_flight(repo, "url-a") as needed:
        assert needed
    clock = iter([90.0, 103.0])
    with single_flight(repo, "url-b") as needed:
        assert needed
    # A run that failed records nothing: the next caller runs it.
    clock = iter([95.0, 104.0])
    with pytest.raises(RuntimeError), single_flight(repo, "url-a") as needed:
        raise RuntimeError("fetch failed")
    clock = iter([102.5, 105.0])
    with single_flight(repo, "url-a") as needed:
        assert needed


def test_fetchers_piled_up_on_a_busy_mirror_all_see_the_remote_tip(
    work: GitWork, origin: Path, tmp_path: Path
) -> None:
    """Many cycles fetching one mirror at once: none returns a mirror older than the remote at
    the time it asked (a fetch recorded before the ask never serves it)."""
    work.fetch("spectral", str(origin))
    mirror = work.mirror_path("spectral")
    tip = commit_to(origin, tmp_path, "main", "NEWS.md", "new\n")
    seen: list[str] = []

    def fetch() -> None:
        seen.append(git(work.fetch("spectral", str(origin)), "rev-parse", "origin/main"))

    threads = [threading.Thread(target=fetch) for _ in range(6)]
    with repo_lock(mirror):  # the mirror is busy while they ask
        for thread in threads:
            thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert seen == [tip] * 6


def test_cycles_of_one_project_commit_side_by_side(work: GitWork, origin: Path) -> None:
    branches = [
        work.start_branch("spectral", str(origin), "main", f"c0ffee0{i}", "sweep") for i in range(4)
    ]
    shas: dict[int, str] = {}

    def commit(i: int) -> None:
        files = {f"results/c{i}/result.json": f'{{"i": {i}}}\n'.encode()}
        shas[i] = work.commit_files(branches[i], files, f"cycle {i}", allowed=RESULTS)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for i, br in enumerate(branches):
        assert work.tip(br) == shas[i]
        assert work.show("spectral", shas[i], f"results/c{i}/result.json") == f'{{"i": {i}}}'
