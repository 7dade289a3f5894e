"""A hostile experiment's surroundings: the launcher's real venv and runtime dirs, a state dir
with another job's export beside the job's own, and a host that can run the sandbox."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app import sandbox
from tests.integration.launcher.conftest import runtime_dir, state_dir, venv

__all__ = ["runtime_dir", "state_dir", "venv"]


@pytest.fixture(autouse=True)
def _needs_sandbox() -> None:
    if why := sandbox.check():
        pytest.skip(f"no sandbox on this host: {why}")


def living_with(token: str) -> list[int]:
    """Pids of the living processes (not zombies) whose argv holds `token`: a sandboxed
    process's own pid is one of its namespace, so the host finds it by what it runs."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if token.encode() not in (entry / "cmdline").read_bytes():
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
