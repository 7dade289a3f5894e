"""A stand-in for the `autopilot` command, for the scripts that start GPU workers (the Slurm batch
script, the Kubernetes GPU pod's entrypoint): it records how each worker was started and whether
the drain (SIGTERM) reached it, without a control plane."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support import wait_for

SCRIPT = r"""#!/bin/bash
# `doctor ...`: its argv appended to $FAKE_DIR/doctor; exits $FAKE_DOCTOR_RC (default 0).
# `worker gpu ... --device N ...`: what it was started with in $FAKE_DIR/worker-N, then it waits
# for SIGTERM, which appends "drained" and exits 0. A device in $FAKE_REFUSE exits 2 at once.
if [ "$1" = doctor ]; then
    echo "$*" >> "$FAKE_DIR/doctor"
    exit "${FAKE_DOCTOR_RC:-0}"
fi
device=""
prev=""
for arg in "$@"; do
    [ "$prev" = --device ] && device="$arg"
    prev="$arg"
done
out="$FAKE_DIR/worker-$device"
if [[ ",${FAKE_REFUSE:-}," == *",$device,"* ]]; then
    echo "error: GPU worker not started: refused for the test" >&2
    exit 2
fi
trap 'echo drained >> "$out"; exit 0' TERM
{
    echo "argv=$*"
    echo "pid=$$"
    echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
    echo "AUTOPILOT_STATE_DIR=${AUTOPILOT_STATE_DIR-unset}"
    echo "AUTOPILOT_WORKER_DEADLINE=${AUTOPILOT_WORKER_DEADLINE-unset}"
} > "$out.tmp"
mv "$out.tmp" "$out"
echo "worker on $device up"
while :; do sleep 0.05; done
"""


@dataclass
class Fake:
    """The fake command's folder: its script, and what its runs wrote."""

    dir: Path

    @classmethod
    def install(cls, root: Path) -> Fake:
        root.mkdir(parents=True, exist_ok=True)
        command = root / "autopilot"
        command.write_text(SCRIPT)
        command.chmod(0o755)
        return cls(root)

    @property
    def command(self) -> str:
        return str(self.dir / "autopilot")

    def worker(self, device: str) -> dict[str, str]:
        """How the worker on `device` was started (its `key=value` lines), once it has been."""
        path = self.dir / f"worker-{device}"
        lines = wait_for(lambda: path.is_file() and path.read_text().splitlines(), timeout=20)
        return dict(line.split("=", 1) for line in lines if "=" in line)

    def workers(self) -> list[str]:
        found = self.dir.glob("worker-*")
        return sorted(p.name.removeprefix("worker-") for p in found if p.suffix != ".tmp")

    def drained(self, device: str) -> bool:
        path = self.dir / f"worker-{device}"
        return path.is_file() and "drained" in path.read_text().splitlines()

    def doctor_calls(self) -> list[str]:
        path = self.dir / "doctor"
        return path.read_text().splitlines() if path.exists() else []


def start(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """A script under bash in a session of its own (its workers die with the test's cleanup)."""
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
    """Its exit status and output; whatever is left of its session is killed."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, output
