"""What one run may use, tried from inside the run: an event flood, a fork bomb, a memory hog and
a double-forked sleeper, each run through the real runner in its real sandbox and cgroup. Each
asserts the limit held and that the run's outcome names it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.sandbox import cgroups
from tests.integration.launcher.conftest import make_job  # noqa: F401 - the fixture
from workers.launcher import confine
from workers.launcher.launch import LaunchSpec
from workers.launcher.runner import Limits, run_job

MakeJob = Callable[..., LaunchSpec]

SEND = """
import json, os, socket
_s = socket.socket(socket.AF_UNIX)
_s.connect(os.environ["AUTOPILOT_EVENTS"])
def send(ev):
    _s.sendall((json.dumps(ev) + "\\n").encode())
def result(obj):
    with open(os.environ["AUTOPILOT_RESULT"], "w") as f:
        json.dump(obj, f)
"""


def sandboxed(make: MakeJob, body: str, *, sandbox_on: bool = True) -> LaunchSpec:
    """A job in a cgroup of its own, named as a worker names its jobs' (`.w<pid>`)."""
    name = f"limits-{uuid.uuid4().hex[:8]}{confine.owner_suffix()}"
    return make(body, sandboxed=sandbox_on, cgroup=name)


def unenforced(limits: cgroups.Limits) -> list[str]:
    """The limits of `limits` this host cannot set on a run's cgroup (none: all enforced)."""
    probe = cgroups.Cgroup.create(f"limits-probe{confine.owner_suffix()}", limits=limits)
    try:
        return probe.unenforced
    finally:
        probe.remove()


def with_limits(monkeypatch: pytest.MonkeyPatch, limits: cgroups.Limits) -> None:
    """Every run's cgroup opened in this test gets `limits` (as `confine.configure` gives a
    worker's); skips where this host's cgroup v2 cannot hold one of them."""
    missing = unenforced(limits)
    if missing:
        # e.g. a host whose pids and memory controllers are bound to cgroup v1 hierarchies
        pytest.skip(f"this host cannot set the limit: {missing[0]}")
    monkeypatch.setattr(confine._Configured, "limits", limits)


def test_an_event_flood_keeps_at_most_the_byte_cap(make_job: MakeJob) -> None:  # noqa: F811
    job = sandboxed(
        make_job,
        SEND
        + """
pad = "x" * 1000
for i in range(3000):
    send({"type": "sample", "i": i, "pad": pad})
result({})
""",
    )
    cap = 64 << 10
    seen = [0]

    def on_event(_event: dict[str, Any]) -> None:
        seen[0] += 1

    out = run_job(job, limits=Limits(timeout_s=60, max_events_total_bytes=cap), on_event=on_event)
    assert out.ok, out.stderr
    assert 0 < out.events_kept_bytes <= cap
    # every event is ~1 KiB: the cap keeps ~64 of 3000; the rest are counted, not kept
    assert len(out.events) < 70
    assert out.events_dropped == 3000 - len(out.events)
    assert seen[0] == 3000  # the log and the heartbeat still see every one
    (note,) = [line for line in out.notes() if line.startswith("[events]")]
    assert f"{out.events_dropped} event(s) dropped" in note
    assert f"cap is {cap} bytes" in note


@pytest.mark.parametrize("sandbox_on", [True, False], ids=["sandboxed", "unconfined"])
def test_nothing_a_run_double_forked_outlives_it(
    make_job: MakeJob,  # noqa: F811
    sandbox_on: bool,
) -> None:
    marker = f"sleeper-{uuid.uuid4().hex}"
    job = sandboxed(
        make_job,
        SEND
        + f"""
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)",
                                  "{marker}"])
    os._exit(0)
os.wait()
send({{"type": "log", "message": "detached"}})
result({{}})
""",
        sandbox_on=sandbox_on,
    )
    out = run_job(job, limits=Limits(timeout_s=60))
    assert out.ok, out.stderr
    assert [e["message"] for e in out.events] == ["detached"]
    # Seen from the host, whatever its pid inside: no process carries the marker any more.
    alive = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    alive.append(int(proc.name))
            except OSError:
                continue
    assert alive == []
    assert not (cgroups.cgroup_base() / str(job.cgroup)).exists()


def test_a_fork_bomb_meets_pids_max_and_the_run_fails_naming_it(
    make_job: MakeJob,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_limits(monkeypatch, cgroups.Limits(pids=64))
    job = sandboxed(
        make_job,
        """
import os, time
children = 0
for _ in range(10000):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    children += 1
print("forked", children)
open(os.environ["AUTOPILOT_RESULT"], "w").write("{}")
""",
    )
    out = run_job(job, limits=Limits(timeout_s=60))
    assert "forked" in out.stdout
    assert int(out.stdout.split()[-1]) < 64  # the bomb stopped at the limit, not at 10000
    assert not out.ok
    assert out.limit is not None and "pids.max = 64" in out.limit
    assert out.result_error is not None and "pids.max = 64" in out.result_error


def test_a_memory_hog_is_oom_killed_at_memory_max_and_the_log_says_so(
    make_job: MakeJob,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_limits(monkeypatch, cgroups.Limits(memory=64 << 20))
    job = sandboxed(
        make_job,
        """
hog = []
for _ in range(64):
    hog.append(bytearray(16 << 20))  # 1 GiB in all, each page touched
""",
    )
    out = run_job(job, limits=Limits(timeout_s=60))
    assert out.signal == "SIGKILL"
    assert out.limit is not None and f"memory.max = {64 << 20}" in out.limit
    assert "OOM-killed" in out.limit
    assert any(line.startswith("[limits]") and "memory.max" in line for line in out.notes())


def test_limits_a_host_cannot_set_are_said_not_raised(tmp_path: Path) -> None:
    # A folder that is no cgroup: nothing can be set, and each limit says why.
    fake = cgroups.Cgroup(tmp_path / "run")
    fake.path.mkdir()
    fake.apply(cgroups.Limits(pids=100, memory=1 << 30))
    assert [line.split(" not set")[0] for line in fake.unenforced] == [
        "pids.max = 100",
        f"memory.max = {1 << 30}",
    ]
    assert fake.limit_hit() is None
    # no interface file was made up, in it or in its parent
    assert os.listdir(tmp_path) == ["run"]
    assert not os.listdir(tmp_path / "run")
