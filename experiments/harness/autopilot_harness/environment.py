"""What a result needs to be reproduced: interpreter, libraries, device, CPU, venv, commit."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _run(args: list[str], cwd: Path | None = None) -> str | None:
    exe = shutil.which(args[0])
    if exe is None:
        return None
    try:
        done = subprocess.run(  # noqa: S603 - fixed argument lists, no shell
            [exe, *args[1:]], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip()
    return out if done.returncode == 0 and out else None


def git_commit(cwd: Path) -> str | None:
    return _run(["git", "rev-parse", "HEAD"], cwd=cwd)


def gpu_driver() -> str | None:
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


def capture(device: str, cwd: Path) -> dict[str, Any]:
    import numpy

    from autopilot_harness._torch import require_torch

    torch = require_torch()
    cuda = device == "cuda" and torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "cuda": torch.version.cuda,
        "driver": gpu_driver() if cuda else None,
        "device": device,
        "device_name": torch.cuda.get_device_name() if cuda else cpu_model(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "requirements_hash": os.environ.get("AUTOPILOT_REQUIREMENTS_HASH") or None,
        "git_commit": git_commit(cwd),
    }
