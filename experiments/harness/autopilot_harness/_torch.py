"""Import torch with a message that says what to do when the project venv lacks it."""

from __future__ import annotations

from types import ModuleType


def require_torch() -> ModuleType:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the venv
        raise ImportError(
            "autopilot_harness needs torch, which it does not install itself (an unpinned "
            "torch pulls a multi-GB CUDA build). Install the build for this host first, "
            "e.g. `pip install torch==2.13.0` on a CPU machine."
        ) from exc
    return torch
