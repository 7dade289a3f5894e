"""`GitRunner.ref_tips` reads a ref's tip from the repository's files where they answer for
certain (`refstore`) and asks git otherwise: compared with git on loose and packed refs,
symbolic refs, an annotated tag under a branch's name, and refs that move under it."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest

from app.git import refstore
from app.git.runner import GitRunner, git_program, minimal_env
from tests.integration.forge.gitrepo import git


@pytest.fixture(autouse=True)
def nothing_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no id known (two tests' commits may well have the same id)."""
    monkeypatch.setattr(refstore, "_commits", OrderedDict())
    monkeypatch.setattr(refstore, "_packed", {})


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A bare repository with two commits on main and a branch at the first."""
    work, bare = tmp_path / "work", tmp_path / "bare.git"
    work.mkdir()
    git(work, "init", "-q", "--initial-branch=main")
    git(work, "commit", "-q", "--allow-empty", "-m", "one")
    git(work, "branch", "first")
    git(work, "commit", "-q", "--allow-empty", "-m", "two")
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    return bare


class CountingRunner(GitRunner):
    """The real runner, counting the git processes it starts."""

    def __init__(self) -> None:
        super().__init__(author=("a", "a@example.invalid"))
        self.calls: list[str] = []

    def run_bytes(self, args, cwd, **kwargs):  # type: ignore[no-untyped-def, override]
        self.calls.append(str(args[0]))
        return super().run_bytes(args, cwd, **kwargs)


def test_a_known_tip_is_read_from_the_files_and_agrees_with_git(repo: Path) -> None:
    runner = CountingRunner()
    refs = ("refs/heads/main", "refs/heads/first", "refs/heads/absent")
    first = runner.ref_tips(repo, *refs)  # unknown ids: git answers, and they become known
    assert runner.calls == ["for-each-ref"]
    assert first == {
        "refs/heads/main": git(repo, "rev-parse", "main"),
        "refs/heads/first": git(repo, "rev-parse", "first"),
    }
    assert runner.ref_tips(repo, *refs) == first
    assert runner.calls == ["for-each-ref"], "the second read started git"


def test_packed_refs_are_read_and_read_again_when_they_change(repo: Path) -> None:
    runner = CountingRunner()
    git(repo, "pack-refs", "--all", "--prune")
    assert not (repo / "refs" / "heads" / "main").exists()
    tips = runner.ref_tips(repo, "refs/heads/main", "refs/heads/first")
    assert runner.ref_tips(repo, "refs/heads/first") == {
        "refs/heads/first": tips["refs/heads/first"]
    }
    calls = len(runner.calls)
    # Moved by git and packed again: the new packed-refs is parsed, not the one kept.
    git(repo, "update-ref", "refs/heads/first", tips["refs/heads/main"])
    git(repo, "pack-refs", "--all", "--prune")
    assert runner.ref_tips(repo, "refs/heads/first") == {
        "refs/heads/first": tips["refs/heads/main"]
    }
    assert len(runner.calls) == calls, "a known id in packed-refs started git"
    # Deleted: gone from the files, so gone from the answer.
    git(repo, "update-ref", "-d", "refs/heads/first")
    assert runner.ref_tips(repo, "refs/heads/first") == {}


def test_a_loose_ref_wins_over_its_packed_line(repo: Path) -> None:
    runner = CountingRunner()
    tips = runner.ref_tips(repo, "refs/heads/main", "refs/heads/first")
    git(repo, "pack-refs", "--all")  # packed, and the loose files kept
    git(repo, "update-ref", "refs/heads/first", tips["refs/heads/main"])  # loose again, moved
    assert runner.ref_tips(repo, "refs/heads/first") == {
        "refs/heads/first": tips["refs/heads/main"]
    }


def test_an_annotated_tag_under_a_branch_name_is_read_as_its_commit(repo: Path) -> None:
    runner = CountingRunner()
    commit = git(repo, "rev-parse", "main")
    git(repo, "tag", "-a", "-m", "a tag", "t", commit)
    tag = git(repo, "rev-parse", "refs/tags/t")
    # Only a fetch can put a tag object under refs/heads: write the ref file as it would.
    (repo / "refs" / "remotes" / "origin").mkdir(parents=True)
    (repo / "refs" / "remotes" / "origin" / "main").write_text(tag + "\n")
    for _ in range(2):  # the tag's id never becomes known as a commit: git answers each time
        calls = len(runner.calls)
        assert runner.ref_tips(repo, "refs/remotes/origin/main") == {
            "refs/remotes/origin/main": commit
        }
        assert len(runner.calls) > calls


def test_a_symbolic_ref_or_an_unknown_id_is_left_to_git(repo: Path) -> None:
    runner = CountingRunner()
    main = runner.ref_tips(repo, "refs/heads/main")["refs/heads/main"]
    git(repo, "symbolic-ref", "refs/heads/alias", "refs/heads/main")
    assert refstore.tips(repo, ("refs/heads/alias",)) is None
    assert runner.ref_tips(repo, "refs/heads/alias") == {"refs/heads/alias": main}
    unknown = git(repo, "commit-tree", git(repo, "rev-parse", "main^{tree}"), "-m", "new")
    git(repo, "update-ref", "refs/heads/new", unknown)
    assert refstore.tips(repo, ("refs/heads/new",)) is None  # not known here yet
    assert runner.ref_tips(repo, "refs/heads/new") == {"refs/heads/new": unknown}
    assert refstore.tips(repo, ("refs/heads/new",)) == {"refs/heads/new": unknown}


def test_a_directory_that_is_not_a_repository_is_left_to_git(tmp_path: Path) -> None:
    assert refstore.tips(tmp_path, ("refs/heads/main",)) is None


def test_git_is_found_once_on_the_path_it_is_given(tmp_path: Path) -> None:
    found = git_program(minimal_env()["PATH"])
    assert Path(found).is_absolute() and Path(found).name == "git"
    # Another PATH is looked up on its own: a wrapper placed first is the git that runs.
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {found} "$@"\n')
    wrapper.chmod(0o755)
    assert git_program(f"{wrapper.parent}:{minimal_env()['PATH']}") == str(wrapper)
