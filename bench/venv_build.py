"""Venv build time: uv (`uv venv` + `uv pip install`, as project venvs are built) against pip
(`python -m venv` + `pip install`, as they were), in the same run, from an empty cache and from
a warm one.

The venv is a project venv as the GPU host builds it (`workers.launcher.venv_build.build`, the
lock step included): the harness (a local folder, built from source) and a few common packages
(REQUIREMENTS), without the host's packages. Builds alternate between the two installers.
"Cold": each build gets empty caches (everything is downloaded and built again); "warm": the
caches a first, uncounted build filled (what the second and later venvs of a host see). Figures
are medians; the ratio is uv's median over pip's.

    python bench/venv_build.py [--quick] [--json] [--sandbox]

Needs the package index (PyPI) for the cold builds: it measures downloads too, so a slow or
loaded network shows in the cold figures.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, bench_parser, emit, machine

from workers.launcher import venv_build

REQUIREMENTS = [
    str(ROOT / "experiments" / "harness"),  # needs numpy
    "requests",
    "rich",
    "pyyaml",
]
INSTALLERS = ("uv", "pip")


def build_once(work: Path, installer: str, sandboxed: bool) -> tuple[float, int]:
    """One build in `work` (its caches are `work`'s); (seconds, packages in its lock)."""
    target = work / f"venv-{installer}-{time.monotonic_ns()}"
    started = time.perf_counter()
    built = venv_build.build(
        target,
        REQUIREMENTS,
        system_site_packages=False,
        base_python=sys.executable,
        log_path=work / f"{target.name}.log",
        report=lambda _phase, _line: None,
        install_timeout_s=900.0,
        sandboxed=sandboxed,
        installer=installer,
    )
    seconds = time.perf_counter() - started
    shutil.rmtree(target)
    return seconds, len(built.lock)


def measure(root: Path, builds: int, sandboxed: bool) -> dict[str, Any]:
    times: dict[str, dict[str, list[float]]] = {"cold": {}, "warm": {}}
    packages: dict[str, int] = {}
    warm = {name: root / f"warm-{name}" for name in INSTALLERS}
    for name, folder in warm.items():
        folder.mkdir()
        build_once(folder, name, sandboxed)  # fills the caches; not counted
    for i in range(builds):
        order = INSTALLERS if i % 2 == 0 else INSTALLERS[::-1]
        for name in order:
            cold = root / f"cold-{name}-{i}"
            cold.mkdir()
            seconds, packages[name] = build_once(cold, name, sandboxed)
            shutil.rmtree(cold)
            times["cold"].setdefault(name, []).append(seconds)
            seconds, _ = build_once(warm[name], name, sandboxed)
            times["warm"].setdefault(name, []).append(seconds)
    result: dict[str, Any] = {}
    for mode, by_installer in times.items():
        medians = {name: statistics.median(v) for name, v in by_installer.items()}
        result[mode] = {
            **{f"{name}_median_s": round(m, 3) for name, m in medians.items()},
            **{f"{name}_runs_s": [round(v, 3) for v in by_installer[name]] for name in INSTALLERS},
            "ratio_uv_over_pip": round(medians["uv"] / medians["pip"], 3),
        }
    result["packages"] = packages
    return result


def main() -> None:
    ap = bench_parser(__doc__, quick="2 builds per installer and cache state instead of 5")
    ap.add_argument("--sandbox", action="store_true", help="build under bubblewrap")
    args = ap.parse_args()
    builds = 2 if args.quick else 5
    root = Path(tempfile.mkdtemp(prefix="ap-bench-venv-"))
    try:
        figures = measure(root, builds, args.sandbox)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "bench": "venv_build",
        "machine": machine("cpu", "cores", "python", "os", "date"),
        "builds_per_installer_and_cache": builds,
        "sandboxed": args.sandbox,
        "requirements": ["<harness>", *REQUIREMENTS[1:]],
        **figures,
    }
    emit(result, args.json, text=_text)


def _text(result: dict[str, Any]) -> None:
    print(f"venv build, {result['builds_per_installer_and_cache']} builds each, medians")
    print(f"  packages in the lock: {result['packages']}")
    for mode in ("cold", "warm"):
        row = result[mode]
        print(
            f"  {mode} cache: uv {row['uv_median_s']:.2f} s, pip {row['pip_median_s']:.2f} s, "
            f"uv/pip {row['ratio_uv_over_pip']:.3f}"
        )


if __name__ == "__main__":
    main()
