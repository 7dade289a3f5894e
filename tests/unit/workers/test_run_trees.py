"""Each run's fresh tree: a copy of its arm's export that keeps what `setup` left as it is
(links as links, FIFOs as FIFOs, modes), and goes after the run whatever the run made of it,
never through a link it planted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from workers.evaluator import fresh_tree, remove_tree


def test_a_fresh_tree_is_the_export_as_it_is(tmp_path: Path) -> None:
    export = tmp_path / "src"
    (export / "pkg").mkdir(parents=True)
    (export / "pkg" / "run.sh").write_text("echo hi\n")
    (export / "pkg" / "run.sh").chmod(0o755)
    os.mkfifo(export / "pipe")  # what a setup could leave: copied as a FIFO, never read
    (export / "etc").symlink_to("/etc")
    dest = tmp_path / "runs" / "000-candidate" / "tree"
    fresh_tree(export, dest)
    assert (dest / "pkg" / "run.sh").read_text() == "echo hi\n"
    assert stat.S_IMODE((dest / "pkg" / "run.sh").stat().st_mode) == 0o755
    assert stat.S_ISFIFO((dest / "pipe").lstat().st_mode)
    assert os.readlink(dest / "etc") == "/etc"
    # a second copy over a run's leftovers starts clean
    (dest / "cache.json").write_text("{}")
    fresh_tree(export, dest)
    assert not (dest / "cache.json").exists()


def test_a_missing_export_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cannot copy .*nowhere"):
        fresh_tree(tmp_path / "nowhere", tmp_path / "runs" / "tree")


def test_a_runs_tree_goes_whatever_it_left_and_never_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("kept")
    tree = tmp_path / "runs" / "000-candidate" / "tree"
    (tree / "locked" / "deep").mkdir(parents=True)
    (tree / "locked" / "deep" / "f").write_text("x")
    (tree / "out").symlink_to(outside)
    (tree / "locked").chmod(0)
    remove_tree(tree.parent)
    assert not tree.parent.exists()
    assert (outside / "keep").read_text() == "kept"
    remove_tree(tree.parent)  # already gone: nothing to do
