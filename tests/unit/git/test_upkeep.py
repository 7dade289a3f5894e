"""When git's upkeep runs in a repository: once per so many writes, or after a while."""

from __future__ import annotations

from pathlib import Path

from app.git.upkeep import Upkeep


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_upkeep_is_due_once_per_every_writes_of_a_repository(tmp_path: Path) -> None:
    upkeep = Upkeep(every=3, period_s=1e9, clock=Clock())
    a, b = tmp_path / "a.git", tmp_path / "b.git"
    # the first write in a process, then every third
    assert [i for i in range(8) if upkeep.due(a)] == [0, 3, 6]
    # another repository keeps its own count
    assert [i for i in range(4) if upkeep.due(b)] == [0, 3]


def test_upkeep_is_due_after_its_period_even_for_few_writes(tmp_path: Path) -> None:
    clock = Clock()
    upkeep = Upkeep(every=100, period_s=60.0, clock=clock)
    repo = tmp_path / "a.git"
    assert upkeep.due(repo)  # its first write in this process
    assert not upkeep.due(repo)
    clock.now += 59.0
    assert not upkeep.due(repo)
    clock.now += 1.0
    assert upkeep.due(repo)  # 60 s since the last check
    assert not upkeep.due(repo)  # and the period starts again


def test_many_writes_never_go_without_upkeep(tmp_path: Path) -> None:
    """Thousands of cycles' writes: the check runs every `every` of them, never less often."""
    upkeep = Upkeep(every=25, period_s=1e9, clock=Clock())
    repo = tmp_path / "forge.git"
    due = [i for i in range(5000) if upkeep.due(repo)]
    assert len(due) == 200 and due[0] == 0
    assert max(b - a for a, b in zip(due, due[1:], strict=False)) == 25
