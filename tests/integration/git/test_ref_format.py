"""`accepts_ref` answers as `git check-ref-format` does: compared with git itself on names
built to hit each of its rules, and on their neighbours that pass."""

from __future__ import annotations

import subprocess

import pytest

from app.git.exceptions import InvalidRef
from app.git.runner import accepts_ref, check_branch_name, minimal_env

NAMES = [
    "main",
    "autopilot/lab/12-sweep",
    "a.b/c-d_e",
    "x.lock.y",
    "lock",
    "a@b",
    "@",
    "a/@",
    "ünïcode/zweig",
    "a/.b",
    ".a",
    "a/b.",
    "a.",
    "a.lock",
    "a/b.lock/c",
    "a..b",
    "a//b",
    "a/",
    "a@{1}",
    "a b",
    "a~1",
    "a^",
    "a:b",
    "a?",
    "a*",
    "a[b",
    "a\\b",
    "a\x7fb",
    "a\tb",
    "a\x01",
    "-a",
    "a/-b",
    "a.b.",
    "a/..",
    "...",
    "a/...b",
    "@a",
    "a@",
    "{a}",
    "a}b",
    "a/b/c/d/e",
]


def git_accepts(ref: str) -> bool:
    return (
        subprocess.run(  # noqa: S603 - fixed argv
            ["git", "check-ref-format", ref],  # noqa: S607 - git from PATH
            env=minimal_env(),
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )


@pytest.mark.parametrize("name", NAMES)
def test_the_rules_agree_with_git(name: str) -> None:
    for ref in (f"refs/heads/{name}", name):
        assert accepts_ref(ref) == git_accepts(ref), ref


def test_a_branch_git_refuses_is_refused_with_its_name() -> None:
    assert check_branch_name("autopilot/lab/1-x") == "autopilot/lab/1-x"
    with pytest.raises(InvalidRef, match="'a/.b' is not a valid git ref"):
        check_branch_name("a/.b")
