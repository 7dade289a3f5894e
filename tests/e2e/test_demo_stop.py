"""`autopilot demo` as `make run` runs it (it keeps running after its cycle), stopped the ways a
user stops it: `kill` (SIGTERM), closing the terminal (SIGHUP), `kill -9`, Ctrl-C (SIGINT).
Each time no process it started is left, by the pids it recorded in its lock file and by a scan
of /proc for processes whose cwd, command line or environment names its state dir. A second
demo on the same state dir, or on the same port, refuses with one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app import demo_lock
from tests.support import alive, free_port, port_open, wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc and PR_SET_PDEATHSIG")

CYCLE_S = 300  # a whole cycle here takes about 40 s
UP_S = 90
GONE_S = 40  # the services' warm shutdown, with the demo's 15 s grace before SIGKILL


@dataclass
class Demo:
    proc: subprocess.Popen[bytes]
    state_dir: Path
    port: int
    stdout: Path
    stderr: Path

    def err(self) -> str:
        return self.stderr.read_text(errors="replace")

    def record(self) -> demo_lock.DemoRecord | None:
        return demo_lock.running(self.state_dir)

    def up(self) -> demo_lock.DemoRecord | None:
        """The lock's record once the API answers and all three services are recorded."""
        assert self.proc.poll() is None, self.err()[-3000:]
        record = self.record()
        if record is None or len(record.services) < 3:
            return None
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{record.url}/healthz", timeout=1).status_code == 200:
                return record
        return None


StartDemo = Callable[..., Demo]


def demo_env(state_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
    env.update(AUTOPILOT_STATE_DIR=str(state_dir), AUTOPILOT_PORT=str(port))
    return env


@pytest.fixture
def start_demo(tmp_path: Path) -> Iterator[StartDemo]:
    started: list[Demo] = []

    def start(name: str = "a", port: int | None = None) -> Demo:
        state_dir = tmp_path / name / "var"
        state_dir.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        n = len(started)
        out, err = tmp_path / f"demo-{n}.out", tmp_path / f"demo-{n}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", "demo"],
                env=demo_env(state_dir, port),
                cwd=state_dir.parent,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,  # as in its own terminal
            )
        demo = Demo(proc, state_dir, port, out, err)
        started.append(demo)
        return demo

    yield start
    # A failed test leaves nothing running on the CI host either: the lock file names the
    # services even after its demo died.
    for demo in started:
        with contextlib.suppress(ProcessLookupError):
            demo.proc.kill()
        demo.proc.wait()
        path = demo_lock.lock_path(demo.state_dir)
        record = demo_lock.DemoRecord.parse(path.read_text()) if path.exists() else None
        for pid in record.services.values() if record else ():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def leftovers(state_dir: Path) -> list[str]:
    """Live processes whose cwd, command line or environment names the state dir."""
    marker = str(state_dir.absolute())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # exited, waiting for its parent to reap it
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if cwd.startswith(marker) or marker in cmdline or marker in environ:
            found.append(f"{entry.name}: {cmdline[:200]} (cwd {cwd})")
    return found


def assert_all_gone(demo: Demo, services: dict[str, int]) -> None:
    """Within a deadline: no recorded service, nothing naming the state dir, the port free and
    the lock free."""
    assert set(services) == {"api", "control", "gpu-cpu-0"}
    wait_for(lambda: not any(alive(pid) for pid in services.values()), timeout=GONE_S)
    try:
        wait_for(lambda: not leftovers(demo.state_dir), timeout=GONE_S)
    except AssertionError:
        raise AssertionError(f"left running: {leftovers(demo.state_dir)}") from None
    assert not port_open(demo.port)
    assert demo.record() is None


def test_sigterm_after_review_stops_every_service(start_demo: StartDemo) -> None:
    demo = start_demo()
    wait_for(lambda: "The service keeps running" in demo.err(), timeout=CYCLE_S, interval=0.5)
    assert "verdict:" in demo.stdout.read_text()
    record = demo.up()
    assert record is not None and record.pid == demo.proc.pid

    # `autopilot status` on the same state dir lists the demo's services, alive.
    def status(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "workers.cli", "status", *args],
            env=demo_env(demo.state_dir, demo.port),
            cwd=demo.state_dir.parent,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout

    shown = json.loads(status("--json"))["demo"]
    assert shown["pid"] == demo.proc.pid and shown["url"] == f"http://127.0.0.1:{demo.port}"
    assert {(s["name"], s["pid"], s["alive"]) for s in shown["services"]} == {
        (name, pid, True) for name, pid in record.services.items()
    }
    text = status()
    assert f"DEMO  pid {demo.proc.pid} on {record.url}" in text
    for name, pid in record.services.items():
        assert re.search(rf"^  {re.escape(name)} +pid {pid} +alive$", text, re.MULTILINE), text

    demo.proc.send_signal(signal.SIGTERM)  # `kill`, an IDE's stop button

    assert demo.proc.wait(timeout=GONE_S) == 0, demo.err()[-3000:]
    assert_all_gone(demo, record.services)


def test_sighup_stops_every_service(start_demo: StartDemo) -> None:
    demo = start_demo()
    record = wait_for(demo.up, timeout=UP_S, interval=0.2)

    demo.proc.send_signal(signal.SIGHUP)  # the terminal window is closed

    assert demo.proc.wait(timeout=GONE_S) == 128 + signal.SIGHUP, demo.err()[-3000:]
    assert "stopped by SIGHUP" in demo.err()
    assert_all_gone(demo, record.services)


def test_sigkill_leaves_nothing_and_the_next_demo_takes_the_lock_over(
    start_demo: StartDemo,
) -> None:
    demo = start_demo()
    record = wait_for(demo.up, timeout=UP_S, interval=0.2)

    demo.proc.send_signal(signal.SIGKILL)  # no handler runs: the services' parent-death signal

    demo.proc.wait(timeout=10)
    assert_all_gone(demo, record.services)

    # The dead demo's lock file is still there, naming it; the next demo takes it over.
    assert json.loads(demo_lock.lock_path(demo.state_dir).read_text())["pid"] == demo.proc.pid
    again = start_demo(port=demo.port)
    second = wait_for(again.up, timeout=UP_S, interval=0.2)
    assert f"a stale demo lock (pid {demo.proc.pid}" in again.err()

    again.proc.send_signal(signal.SIGINT)  # Ctrl-C

    assert again.proc.wait(timeout=GONE_S) == 128 + signal.SIGINT, again.err()[-3000:]
    assert_all_gone(again, second.services)


def test_a_second_demo_refuses_on_the_same_state_dir_or_port(start_demo: StartDemo) -> None:
    demo = start_demo("a")
    record = wait_for(demo.up, timeout=UP_S, interval=0.2)

    same_dir = subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo"],
        env=demo_env(demo.state_dir, free_port()),
        cwd=demo.state_dir.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert same_dir.returncode == 2, same_dir.stderr
    (line,) = same_dir.stderr.strip().splitlines()
    assert f"pid {demo.proc.pid}" in line and record.url in line

    other = demo.state_dir.parent.parent / "b" / "var"
    same_port = subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo"],
        env=demo_env(other, demo.port),
        cwd=demo.state_dir.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert same_port.returncode == 2, same_port.stderr
    (line,) = same_port.stderr.strip().splitlines()
    assert f"port {demo.port}" in line and "AUTOPILOT_PORT" in line
    # It started nothing and holds no lock; the first demo is unharmed.
    assert demo_lock.running(other) is None and not leftovers(other)
    assert demo.up() is not None

    demo.proc.send_signal(signal.SIGTERM)
    demo.proc.wait(timeout=GONE_S)
    assert_all_gone(demo, record.services)
