"""The three report files of a cycle written to a folder, for the tests that read them as files
(the service commits them from objects: `app.reports.cycle.render_files`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.reports.cycle import ReportContext, render_files, results_dir


@dataclass(frozen=True)
class ReportFiles:
    directory: Path
    result: Path
    report: Path
    plot: Path

    def relative(self, root: Path) -> list[str]:
        return [str(p.relative_to(root)) for p in (self.result, self.report, self.plot)]


def write_report(root: Path, result: Mapping[str, Any], context: ReportContext) -> ReportFiles:
    """Write the three files under `root/results/<cycle>/` and return their paths."""
    directory = root / results_dir(context.cycle_id)
    directory.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(
        directory, directory / "result.json", directory / "REPORT.md", directory / "plot.svg"
    )
    for relative, content in render_files(result, context).items():
        (root / relative).write_bytes(content)
    return files
