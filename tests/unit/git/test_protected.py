"""Protected-path patterns: what counts as the judge."""

from __future__ import annotations

import pytest

from app.git.exceptions import ProtectedPathChanged
from app.git.protected import Check, is_protected, patterns_from_config


def test_patterns_from_config() -> None:
    text = '[protected]\npaths = ["./experiments/harness/", "eval/*.py", "data/ref.npz"]\n'
    patterns = patterns_from_config(text)
    assert patterns == [
        "autopilot.toml",
        "results/",
        "experiments/harness/",
        "eval/*.py",
        "data/ref.npz",
    ]
    assert patterns_from_config('protected = ["x"]\n')[-1] == "x"
    assert patterns_from_config(None) == ["autopilot.toml", "results/"]
    with pytest.raises(ProtectedPathChanged):
        patterns_from_config("[protected]\npaths = 3\n")


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("experiments/harness/judge.py", True),
        ("experiments/harness/sub/deep.py", True),
        ("experiments/harnessX.py", False),
        ("eval/score.py", True),
        ("eval/data.csv", False),
        ("data/ref.npz", True),
        ("autopilot.toml", True),
        ("results/old/result.json", True),
        ("results/c0ffee01/result.json", False),
        ("src/kernel.py", False),
    ],
)
def test_is_protected(path: str, protected: bool) -> None:
    patterns = patterns_from_config(
        '[protected]\npaths = ["experiments/harness", "eval/*.py", "data/ref.npz"]\n'
    )
    assert is_protected(path, patterns, allowed=["results/c0ffee01/"]) is protected


def test_check_names_every_changed_path() -> None:
    check = Check(["x"], {"a": "100644:1", "b": "100644:2"}, {"a": "100644:1", "c": "100644:3"})
    assert check.violations == ["b", "c"]
    with pytest.raises(ProtectedPathChanged, match="b, c"):
        check.raise_for_violations()
