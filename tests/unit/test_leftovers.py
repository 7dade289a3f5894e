"""The end-of-run check for processes a test run left behind (tests/support/leftovers.py)."""

from __future__ import annotations

import os
import subprocess
import uuid

from tests.support import leftovers


def test_a_process_of_the_run_left_alive_is_found_named_and_killed() -> None:
    mark = uuid.uuid4().hex  # another run's mark: this run's own check never sees it
    env = {**os.environ, leftovers.MARK: mark}
    stray = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)  # not of that run
    try:
        assert leftovers.alive(mark) == [stray.pid]
        left = leftovers.kill_left(mark)
        assert len(left) == 1 and f"pid {stray.pid}: sleep 300" in left[0]
        assert stray.wait(timeout=10) == -9
        assert other.poll() is None
        assert leftovers.alive(mark) == []
    finally:
        for proc in (stray, other):
            proc.kill()
            proc.wait()


def test_a_run_whose_processes_all_ended_has_nothing_left() -> None:
    mark = uuid.uuid4().hex
    done = subprocess.run(["true"], env={**os.environ, leftovers.MARK: mark}, check=True)
    assert done.returncode == 0
    assert leftovers.kill_left(mark) == []
