"""Metrics of processes in separate containers that share PROMETHEUS_MULTIPROC_DIR (as
docker-compose.yml's services share the state volume): each container's first process has the
same small pid, so files named by pid alone would clash and one container's counts would
overwrite another's (app/status.py names them by host and pid)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess

from tests.reliability.test_hosts import need_namespaces

REPO = Path(__file__).resolve().parents[3]
COUNT = """
import app.status as status
status.FORGE_ERRORS.labels("github", "push").inc({n})
"""


def in_container(hostname: str, code: str, metrics: Path) -> None:
    """`code` as the first process of a new PID and UTS namespace: pid 1, its own hostname."""
    script = 'hostname "$1"; shift; exec "$@"'
    argv = ["unshare", "--pid", "--uts", "--fork", "sh", "-c", script, "container", hostname]
    done = subprocess.run(
        [*argv, sys.executable, "-c", code],
        env={
            "PROMETHEUS_MULTIPROC_DIR": str(metrics),
            "PYTHONPATH": str(REPO),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_two_containers_with_the_same_pid_keep_their_own_counts(tmp_path: Path) -> None:
    need_namespaces()
    metrics = tmp_path / "metrics"
    in_container("api-1", COUNT.format(n=2), metrics)
    in_container("worker-1", COUNT.format(n=3), metrics)
    assert len(list(metrics.glob("counter_*.db"))) == 2, sorted(metrics.iterdir())
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(metrics))  # type: ignore[no-untyped-call]
    total = registry.get_sample_value(
        "autopilot_forge_errors_total", {"forge": "github", "operation": "push"}
    )
    assert total == 5.0
