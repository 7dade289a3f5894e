"""Socket path budget arithmetic and the alias checks, on plain tmp dirs."""

import os
from pathlib import Path

import pytest

from workers.launcher import runtime
from workers.launcher.runtime import Alias, AliasError, final_path_len, verify_alias


def test_final_length_counts_the_longest_of_runner_sockets_and_the_suffix() -> None:
    assert final_path_len(20, 40) == 60
    assert final_path_len(20, 0) == 20 + 1 + len("ev.sock")
    assert final_path_len(20, 3, socket_names=("a-long-socket-name",)) == 20 + 19


def test_predicted_dir_len_matches_mkdtemp(tmp_path: Path) -> None:
    made = runtime.tempfile.mkdtemp(prefix=runtime.DIR_PREFIX, dir=str(tmp_path))
    assert len(os.fsencode(made)) == runtime.predicted_dir_len(str(tmp_path))
    assert runtime.predicted_dir_len("/tmp/") == len("/tmp/ap-12345678")


def test_survey_passes_over_long_missing_and_relative_roots(tmp_path: Path) -> None:
    long_root = tmp_path / ("d" * 120)
    long_root.mkdir()
    cands = runtime.survey(
        [
            ("TMPDIR", str(long_root)),
            ("x", str(tmp_path / "missing")),
            ("y", "rel"),
            ("z", str(tmp_path)),
        ],
        suffix_len=40,
        need_exec=False,
    )
    assert [c.usable for c in cands] == [True, False, False, True]
    assert "too long" in (cands[0].reason or "")
    assert "does not exist" in (cands[1].reason or "")
    assert "absolute" in (cands[2].reason or "")
    assert cands[3].fits == (cands[3].final_len <= 107)


def test_candidate_order_and_dedup(tmp_path: Path) -> None:
    roots = runtime.candidate_roots({"TMPDIR": "/tmp", "AUTOPILOT_RUNTIME_ROOT": "/r"}, tmp_path)
    assert [r for _, r in roots] == ["/r", "/tmp", "/dev/shm", str(tmp_path / "run")]


@pytest.fixture
def alias(tmp_path: Path) -> Alias:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    target.chmod(0o700)
    link = tmp_path / "ln"
    link.symlink_to(target)
    return Alias(link, target)


def test_a_good_alias_verifies(alias: Alias) -> None:
    verify_alias(alias, suffix_len=10)


def test_wrong_target_is_refused(alias: Alias, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    alias.path.unlink()
    alias.path.symlink_to(other)
    with pytest.raises(AliasError, match="points at"):
        verify_alias(alias, suffix_len=10)


def test_wrong_owner_is_refused(alias: Alias) -> None:
    if os.geteuid() != 0:
        with pytest.raises(AliasError, match="owned by"):
            verify_alias(alias, suffix_len=10, uid=os.geteuid() + 1)
        return
    os.lchown(alias.path, 65534, 65534)
    with pytest.raises(AliasError, match="owned by uid 65534"):
        verify_alias(alias, suffix_len=10)


def test_target_owned_by_another_user_is_refused(alias: Alias) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(alias.target, 65534, 65534)
    with pytest.raises(AliasError, match="target .* owned by uid 65534"):
        verify_alias(alias, suffix_len=10)


def test_open_target_mode_is_refused(alias: Alias) -> None:
    alias.target.chmod(0o755)
    with pytest.raises(AliasError, match="mode 755"):
        verify_alias(alias, suffix_len=10)


def test_a_plain_file_in_place_of_the_alias_is_refused(alias: Alias) -> None:
    alias.path.unlink()
    alias.path.write_text("not mine")
    with pytest.raises(AliasError, match="not a symlink"):
        verify_alias(alias, suffix_len=10)


def test_the_budget_is_checked_through_the_alias(alias: Alias) -> None:
    with pytest.raises(AliasError, match="over the"):
        verify_alias(alias, suffix_len=10, budget=len(str(alias.path)) + 5)
