"""Venv builder and preflight guard against real venvs and real interpreters."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from workers.launcher import guard
from workers.launcher import venv as venv_mod
from workers.launcher.environment import build_child_env
from workers.launcher.venv import (
    COMPLETE_MARKER,
    Venv,
    ensure_venv,
    interpreter_path,
    requirements_hash,
)
from workers.launcher.venv_build import VenvError


def _job_env(venv: Path, tmp: Path, worktree: Path | None = None) -> dict[str, str]:
    return build_child_env(
        base_env=dict(os.environ),
        venv=venv,
        runtime_dir=tmp,
        events_path=tmp / "ev.sock",
        result_path=tmp / "result.json",
        spec_path=tmp / "spec.json",
        cuda_visible_devices="",
        pythonpath=[worktree] if worktree else [],
    )


def _copy_venv(venv: Venv, dest: Path) -> Path:
    """A cheap second venv: the fixture's files, with its own pyvenv.cfg (symlinks kept)."""
    shutil.copytree(venv.path, dest, symlinks=True)
    return dest


def test_venv_is_built_once_and_reused(venv: Venv, state_dir: Path) -> None:
    again = ensure_venv(state_dir, "fixture", ["# only a comment", ""], system_site_packages=True)
    assert again.path == venv.path
    assert not again.built
    assert venv.path.name == f"fixture-{requirements_hash([])[:12]}-py3.11"
    assert (venv.path / COMPLETE_MARKER).is_file()
    assert str(venv.python) == str(venv.path / "bin" / "python")


def test_concurrent_builders_build_once_and_half_built_is_rebuilt(tmp_path: Path) -> None:
    phases: list[str] = []
    results: list[Venv] = []

    def build() -> None:
        results.append(ensure_venv(tmp_path, "p", [], progress=lambda ph, _l: phases.append(ph)))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(r.built for r in results) == [False, True]
    assert "create" in phases and "done" in phases
    assert results[0].log_path.read_text().startswith("$ ")
    # a build that died half-way (no marker) is never used: it is removed and rebuilt
    (results[0].path / COMPLETE_MARKER).unlink()
    (results[0].path / "junk").write_text("half")
    rebuilt = ensure_venv(tmp_path, "p", [])
    assert rebuilt.built
    assert not (rebuilt.path / "junk").exists()


def test_failed_install_leaves_no_usable_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the operator's pip setting reaches pip
    reqs = ["autopilot-no-such-package-xyz"]
    with pytest.raises(VenvError, match="install step failed") as err:
        ensure_venv(tmp_path, "bad", reqs)
    assert "full log:" in str(err.value)
    built = tmp_path / "venvs" / f"bad-{requirements_hash(reqs)[:12]}-py3.11"
    assert not (built / COMPLETE_MARKER).exists()


def test_symlinked_parent_is_not_resolved(venv: Venv, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(venv.path.parent, target_is_directory=True)
    through = link / venv.path.name
    python = interpreter_path(through)
    assert str(python) == str(through / "bin" / "python")  # not resolved
    report = guard.run_guard(
        through, env=_job_env(through, tmp_path), cwd=tmp_path, modules=["json"]
    )
    assert report.ok, report.render()
    out = subprocess.run(
        [str(python), "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(through)


def test_guard_catches_a_resolved_interpreter(venv: Venv, tmp_path: Path) -> None:
    resolved = Path(os.path.realpath(venv.python))
    assert resolved != venv.python
    report = guard.run_guard(
        venv.path, python=resolved, env=_job_env(venv.path, tmp_path), cwd=tmp_path, modules=[]
    )
    assert not report.ok
    failed = {c.name: c for c in report.failures()}
    assert "sys.prefix" in failed
    assert "non-resolved" in failed["sys.prefix"].fix


def test_pyvenv_cfg_removed_is_refused(venv: Venv, tmp_path: Path) -> None:
    copy = _copy_venv(venv, tmp_path / "copy")
    (copy / "pyvenv.cfg").unlink()
    with pytest.raises(VenvError, match="no pyvenv.cfg"):
        interpreter_path(copy)
    report = guard.run_guard(copy, env=_job_env(copy, tmp_path), cwd=tmp_path, modules=[])
    assert not report.ok
    assert "not a venv" in report.failures()[0].detail
    missing = guard.run_guard(tmp_path / "nope", env={}, cwd=tmp_path, modules=[])
    assert not missing.ok
    assert "does not exist" in missing.failures()[0].detail


def test_broken_interpreter_is_reported(venv: Venv, tmp_path: Path) -> None:
    copy = _copy_venv(venv, tmp_path / "broken")
    py = copy / "bin" / "python"
    py.unlink()
    py.write_text("#!/bin/sh\necho 'cannot start' >&2\nexit 3\n")
    py.chmod(0o755)
    report = guard.run_guard(copy, env=_job_env(copy, tmp_path), cwd=tmp_path, modules=[])
    assert not report.ok
    assert "exited 3" in report.failures()[0].detail
    assert "cannot start" in report.failures()[0].detail


def test_a_module_in_cwd_does_not_shadow_the_entry(venv: Venv, tmp_path: Path) -> None:
    worktree, cwd = tmp_path / "wt", tmp_path / "cwd"
    worktree.mkdir()
    cwd.mkdir()
    (worktree / "exp_entry.py").write_text("WHERE = 'worktree'\n")
    (cwd / "exp_entry.py").write_text("WHERE = 'shadow'\n")
    env = _job_env(venv.path, tmp_path, worktree)
    report = guard.run_guard(venv.path, env=env, cwd=cwd, modules=["exp_entry"], worktree=worktree)
    assert report.ok, report.render()
    assert report.modules["exp_entry"] == [str(worktree / "exp_entry.py")]
    # without PYTHONSAFEPATH the cwd copy wins, and the guard says so
    del env["PYTHONSAFEPATH"]
    bad = guard.run_guard(venv.path, env=env, cwd=cwd, modules=["exp_entry"], worktree=worktree)
    assert not bad.ok
    assert str(cwd / "exp_entry.py") in bad.failures()[0].detail


def test_missing_module_is_named(venv: Venv, tmp_path: Path) -> None:
    report = guard.run_guard(
        venv.path,
        env=_job_env(venv.path, tmp_path),
        cwd=tmp_path,
        modules=["json", "autopilot_no_such_module"],
    )
    assert not report.ok
    [failure] = report.failures()
    assert failure.name == "import autopilot_no_such_module"
    assert "ModuleNotFoundError" in failure.detail


def test_a_pass_is_cached_and_the_cache_follows_the_inputs(venv: Venv, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = _job_env(venv.path, tmp_path)
    first = guard.run_guard(venv.path, env=env, cwd=tmp_path, modules=["json"], cache_dir=cache)
    assert first.ok and not first.cached
    env["AUTOPILOT_EVENTS"] = "/tmp/other.sock"  # per-job paths do not matter
    second = guard.run_guard(venv.path, env=env, cwd=tmp_path, modules=["json"], cache_dir=cache)
    assert second.cached and second.ok
    env["OMP_NUM_THREADS"] = "2"  # the env subset does
    third = guard.run_guard(venv.path, env=env, cwd=tmp_path, modules=["json"], cache_dir=cache)
    assert not third.cached
    failing = guard.run_guard(
        venv.path, env=env, cwd=tmp_path, modules=["nope_mod"], cache_dir=cache
    )
    assert not failing.ok
    again = guard.run_guard(venv.path, env=env, cwd=tmp_path, modules=["nope_mod"], cache_dir=cache)
    assert not again.cached  # failures are never cached
    stored = json.loads((cache / f"{first.fingerprint}.json").read_text())
    assert stored["ok"] is True


def test_two_stores_of_one_pass_at_once_both_keep_it(
    venv: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's preparer thread and its loop prepare two jobs of one commit: both store the
    same pass, interleaved. Neither may fail the job (a shared temporary name did: the second
    rename found the first had taken the file)."""
    cache = tmp_path / "cache"
    env = _job_env(venv.path, tmp_path)
    report = guard.run_guard(venv.path, env=env, cwd=tmp_path, modules=["json"])
    assert report.ok
    rename, renamed = os.replace, []

    def interleaved(src: str, dst: Path) -> None:
        if not renamed:  # the other thread writes and renames between this write and rename
            renamed.append("")
            guard._store(cache, report.fingerprint, report)
        rename(src, dst)
        renamed.append(src)

    monkeypatch.setattr(guard.os, "replace", interleaved)
    guard._store(cache, report.fingerprint, report)
    monkeypatch.undo()
    assert len(set(renamed[1:])) == 2  # both renamed a file of their own
    assert [p.name for p in cache.iterdir()] == [f"{report.fingerprint}.json"]  # no temp left
    again = guard.run_guard(venv.path, env=env, cwd=tmp_path, modules=["json"], cache_dir=cache)
    assert again.cached and again.ok


def test_user_site_is_not_trusted(venv: Venv, tmp_path: Path) -> None:
    # the job's env sets PYTHONNOUSERSITE, so a user-site copy is not even on the path
    env = _job_env(venv.path, tmp_path)
    out = subprocess.run(
        [str(venv.python), "-c", "import site,sys; print(site.ENABLE_USER_SITE)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


def test_packages_inherited_from_a_parent_venv_count_as_system_site(
    venv: Venv, tmp_path: Path
) -> None:
    """The fixture venv is built with system site packages from the test run's own venv: its
    packages (pytest here, torch on a worker) are the venv's system site, not strays."""
    inherited = venv_mod.inherited_site_dirs(venv.path)
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a venv: nothing is inherited")
    assert inherited and all(Path(p).is_dir() for p in inherited)
    report = guard.run_guard(
        venv.path, env=_job_env(venv.path, tmp_path), cwd=tmp_path, modules=["pytest"]
    )
    assert report.ok, report.render()
    assert not venv_mod.inherited_site_dirs(tmp_path)  # a folder without the link: none


def test_exports_of_one_commit_share_a_pass(venv: Venv, tmp_path: Path) -> None:
    """Each job exports its commit to a folder of its own: a sweep's jobs (one commit, many
    points) share the pass, a job of another commit or without one runs the probe."""
    cache = tmp_path / "cache"
    trees = [tmp_path / "jobs" / str(n) / "src" for n in (1, 2, 3, 4)]
    for tree in trees:
        tree.mkdir(parents=True)
        (tree / "exp_entry.py").write_text("WHERE = 'worktree'\n")

    def check(tree: Path, commit: str | None) -> guard.GuardReport:
        report = guard.run_guard(
            venv.path,
            env=_job_env(venv.path, tmp_path, tree),
            cwd=tree,
            modules=["exp_entry"],
            worktree=tree,
            cache_dir=cache,
            worktree_commit=commit,
        )
        assert report.ok, report.render()
        return report

    first = check(trees[0], "a" * 40)
    assert not first.cached and first.modules["exp_entry"] == [str(trees[0] / "exp_entry.py")]
    assert check(trees[1], "a" * 40).cached  # the same commit elsewhere
    assert not check(trees[2], "b" * 40).cached  # another commit
    assert not check(trees[3], None).cached  # no commit: the folder counts
    assert check(trees[3], None).cached


def test_a_pass_key_does_not_depend_on_the_workers_directory(
    venv: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "jobs" / "1" / "src"
    tree.mkdir(parents=True)
    key = {
        "venv": venv.path,
        "python": venv.path / "bin" / "python",
        "env": {"PYTHONPATH": str(tree)},
        "cwd": tree,
        "modules": ["exp_entry"],
        "requirements_hash": None,
        "worktree": tree,
        "worktree_commit": "a" * 40,
    }
    first = guard.fingerprint(**key)  # type: ignore[arg-type]
    monkeypatch.chdir(tmp_path)  # another worker process, started elsewhere
    assert guard.fingerprint(**key) == first  # type: ignore[arg-type]
