"""`autopilot demo --once --json`, as `make run` does it: a fresh state dir, no server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_demo_once_reaches_review(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
    port = free_port()
    env.update(AUTOPILOT_STATE_DIR=str(tmp_path / "var"), AUTOPILOT_PORT=str(port))
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo", "--once", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(outcome) == {"cycle_id", "state", "verdict", "pr_url", "dashboard_url"}
    assert outcome["state"] == "awaiting_review"
    assert outcome["verdict"] in ("faster", "slower", "inconclusive", "rejected_accuracy")
    assert outcome["dashboard_url"].endswith(f"/dashboard/cycles/{outcome['cycle_id']}")
    # The API the demo started is gone again: nothing listens on its port.
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0
