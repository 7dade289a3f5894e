"""Runtime dirs on real filesystems: the budget, a real noexec mount, the alias, teardown."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.launcher import runtime
from workers.launcher.runtime import (
    RuntimeDirError,
    allocate_runtime,
    probe_bind,
    release_runtime,
)


def _dir_of_length(base: Path, length: int) -> Path:
    pad = length - len(str(base)) - 1
    assert pad > 0
    path = base / ("p" * pad)
    path.mkdir()
    assert len(str(path)) == length
    return path


def test_long_tmpdir_is_passed_over_and_the_longest_path_binds(tmp_path: Path) -> None:
    long_tmp = _dir_of_length(tmp_path, 150)
    env = {"TMPDIR": str(long_tmp)}
    rt = allocate_runtime(state_dir=tmp_path / "state", env=env)
    try:
        assert rt.candidates[0].source == "TMPDIR"
        assert "too long" in (rt.candidates[0].reason or "")
        assert not str(rt.path).startswith(str(long_tmp))
        assert rt.longest_final_len <= 107
        assert probe_bind(rt) == rt.longest_socket_path
        assert len(os.fsencode(rt.longest_socket_path)) == rt.longest_final_len
        # the same bind under the 150-character TMPDIR is what would have failed
        with socket.socket(socket.AF_UNIX) as s, pytest.raises(OSError, match="too long"):
            s.bind(str(long_tmp / "ap-12345678" / ("x" * 39)))
    finally:
        release_runtime(rt)
    assert not rt.target.exists()


def test_no_fitting_root_is_a_clear_error_and_leaks_nothing(tmp_path: Path) -> None:
    long_tmp = _dir_of_length(tmp_path, 150)
    with pytest.raises(RuntimeDirError, match="AUTOPILOT_RUNTIME_ROOT") as err:
        allocate_runtime(state_dir=tmp_path, env={}, roots=[("TMPDIR", str(long_tmp))])
    assert "too long" in str(err.value)
    assert list(long_tmp.iterdir()) == []


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short dir for aliases (pytest's tmp_path is too long to leave room for a socket)."""
    path = Path(tempfile.mkdtemp(prefix="aps-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def noexec_mount() -> Iterator[Path]:
    """A real noexec tmpfs at a short path (needs root and mount; skipped otherwise)."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    point = Path(tempfile.mkdtemp(prefix="apnx-", dir="/tmp"))
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "noexec,size=1m", "tmpfs", str(point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        point.rmdir()
        pytest.skip(f"cannot mount a noexec tmpfs here: {proc.stderr.strip()}")
    try:
        assert runtime.is_noexec(str(point))
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=False)
        point.rmdir()


def test_noexec_short_root_gets_an_alias_to_an_exec_capable_target(
    noexec_mount: Path, tmp_path: Path
) -> None:
    roomy = _dir_of_length(tmp_path, 100)  # exec-capable, too long with a 40-byte suffix
    roots = [("AUTOPILOT_RUNTIME_ROOT", str(noexec_mount)), ("TMPDIR", str(roomy))]
    rt = allocate_runtime(state_dir=tmp_path, env={}, roots=roots)
    try:
        assert rt.alias is not None
        assert rt.path == rt.alias.path
        assert rt.alias.path.parent == noexec_mount
        assert rt.alias.target.parent == roomy
        assert (rt.target.stat().st_mode & 0o777) == 0o700
        assert "noexec" in (rt.alias_reason or "")
        probe_bind(rt)
        # exec works through the alias: the file lives on the exec-capable filesystem
        script = rt.path / "tool.sh"
        script.write_text("#!/bin/sh\necho ran\n")
        script.chmod(0o700)
        assert (
            subprocess.run([str(script)], capture_output=True, text=True, check=True).stdout
            == "ran\n"
        )
        # and the same file directly on the noexec mount would not run
        direct = noexec_mount / "tool.sh"
        shutil.copy(script, direct)
        with pytest.raises(PermissionError):
            subprocess.run([str(direct)], check=False)
        direct.unlink()
    finally:
        release_runtime(rt)
    assert not os.path.lexists(rt.alias.path)
    assert not rt.alias.target.exists()


def test_without_need_exec_the_noexec_root_is_used_directly(
    noexec_mount: Path, tmp_path: Path
) -> None:
    rt = allocate_runtime(
        state_dir=tmp_path,
        env={},
        need_exec=False,
        roots=[("AUTOPILOT_RUNTIME_ROOT", str(noexec_mount))],
    )
    try:
        assert rt.alias is None
        assert rt.path.parent == noexec_mount
    finally:
        release_runtime(rt)


def test_alias_name_taken_by_another_user_is_left_alone(
    tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("making another user's link needs root")
    short, roomy = short_dir, _dir_of_length(tmp_path, 100)
    taken = short / "ap-aaaaaaaa"
    taken.symlink_to("/etc")
    os.lchown(taken, 65534, 65534)
    names = iter(["aaaaaaaa", "bbbbbbbb"])
    monkeypatch.setattr(runtime.secrets, "token_hex", lambda _n: next(names))
    rt = allocate_runtime(
        state_dir=tmp_path, env={}, roots=[("TMPDIR", str(roomy))], alias_root=str(short)
    )
    try:
        assert rt.alias is not None
        assert rt.alias.path == short / "ap-bbbbbbbb"
    finally:
        release_runtime(rt)
    assert os.readlink(taken) == "/etc"  # someone else's link: untouched
    assert os.lstat(taken).st_uid == 65534


def test_teardown_removes_the_alias_before_the_target(
    tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    short, roomy = short_dir, _dir_of_length(tmp_path, 100)
    rt = allocate_runtime(
        state_dir=tmp_path, env={}, roots=[("TMPDIR", str(roomy))], alias_root=str(short)
    )
    assert rt.alias is not None
    (rt.path / "file").write_text("x")
    seen: list[bool] = []
    real_rmtree = shutil.rmtree

    def rmtree(path: str | os.PathLike[str], *args: object, **kw: object) -> None:
        seen.append(os.path.lexists(rt.alias.path))  # type: ignore[union-attr]
        real_rmtree(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(runtime.shutil, "rmtree", rmtree)
    release_runtime(rt)
    assert seen == [False]
    assert not rt.target.exists()


def test_teardown_does_not_remove_a_replaced_alias(tmp_path: Path, short_dir: Path) -> None:
    short, roomy = short_dir, _dir_of_length(tmp_path, 100)
    rt = allocate_runtime(
        state_dir=tmp_path, env={}, roots=[("TMPDIR", str(roomy))], alias_root=str(short)
    )
    assert rt.alias is not None
    rt.alias.path.unlink()
    rt.alias.path.symlink_to(tmp_path)  # something else took the name meanwhile
    release_runtime(rt)
    assert os.readlink(rt.alias.path) == str(tmp_path)
    assert not rt.target.exists()
