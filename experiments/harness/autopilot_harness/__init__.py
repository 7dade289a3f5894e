"""Experiment side of the Research Autopilot protocol: paired timing, accuracy gates, verdicts.

``stats``, ``protocol`` and ``factorial`` need only numpy; the runner (``experiment``) needs
torch, which the host installs (see pyproject.toml).
"""

from __future__ import annotations

from typing import Any

# Bound first, before any project code can replace a function of `time` (clocks.py).
from autopilot_harness import clocks as clocks

__version__ = "0.1.0"

_LAZY = {"Case", "Context", "Experiment", "ExperimentError", "Factorial", "Variant", "main", "run"}


def __getattr__(name: str) -> Any:
    # Lazy so that the statistics can be imported (and the first event sent) before torch loads.
    if name in _LAZY:
        from autopilot_harness import experiment

        return getattr(experiment, name)
    raise AttributeError(name)
