"""A venv build's progress, summarised from the installer's own output: "building venv: 37
packages, 12 s", for the job's log and the queue page, at most every few seconds (a build
prints hundreds of lines; the log and the database get a handful)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.jobs import preparation

# uv: "Resolved 37 packages in 1.2s", "Installed 37 packages in 50ms", " + numpy==2.1.0";
# pip: "Collecting numpy>=1.26", "Successfully installed numpy-2.1.0 six-1.17.0".
_UV_COUNT = re.compile(r"^(Resolved|Prepared|Installed) (\d+) packages?\b")
_PIP_COLLECTING = re.compile(r"^Collecting \S")
_PIP_INSTALLED = re.compile(r"^Successfully installed (.+)$")


@dataclass(frozen=True)
class BuildStatus:
    """Where a venv build is: its step, how many packages the installer has named so far, and
    how long it has run."""

    step: str  # "create", "install", "check", "freeze", "done"
    packages: int
    elapsed_s: float
    finished: bool = False

    def line(self) -> str:
        return preparation.venv_progress_line(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": "built" if self.finished else "building",
            "step": self.step,
            "packages": self.packages,
            "elapsed_s": round(self.elapsed_s, 1),
        }


class BuildSummary:
    """Fed each (phase, line) of `ensure_venv`'s progress; calls `emit` with a `BuildStatus` when
    the build starts, when its step changes, when the package count moved and `every_s` has
    passed since the last one, and when it ends. A venv that is reused emits nothing."""

    def __init__(
        self,
        emit: Callable[[BuildStatus], None],
        *,
        every_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit, self._every_s, self._clock = emit, every_s, clock
        self._started: float | None = None
        self._step = ""
        self._packages = 0
        self._collected = 0
        self._last_at = 0.0
        self._last_packages = -1

    def __call__(self, phase: str, line: str) -> None:
        if phase == "lock":
            return
        if phase == "done":
            if self._started is not None:  # a build ended (a reused venv never started one)
                self._send("done", finished=True)
            return
        if self._started is None:
            self._started = self._clock()
        self._count(line)
        moved = self._packages != self._last_packages
        if phase != self._step or (moved and self._clock() - self._last_at >= self._every_s):
            self._send(phase)

    def _count(self, line: str) -> None:
        if match := _UV_COUNT.match(line):
            self._packages = max(self._packages, int(match.group(2)))
        elif _PIP_COLLECTING.match(line):
            self._collected += 1
            self._packages = max(self._packages, self._collected)
        elif match := _PIP_INSTALLED.match(line):
            self._packages = max(self._packages, len(match.group(1).split()))

    def _send(self, step: str, *, finished: bool = False) -> None:
        assert self._started is not None
        now = self._clock()
        self._step, self._last_at, self._last_packages = step, now, self._packages
        self._emit(BuildStatus(step, self._packages, now - self._started, finished))
