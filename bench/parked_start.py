"""Time to the first line of a torch experiment: cold start, parked interpreter, parked + preload.

A GPU worker hands each job after its first to an interpreter it parked while the previous job
ran (`workers.launcher.spare.Spare`); with the project's `preload = ["torch", "numpy"]` the
parked interpreter has imported them too. The job module imports torch and numpy at its top,
then reports its first line (the `started` event, the job's own clock). Measured from the
hand-over (or spawn) to that line, interleaved rounds, medians. The cold start is the
baseline, in the same run.

    python bench/parked_start.py [--rounds N] [--json]
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import bench_parser, emit, machine, module_job, today

from workers.launcher.runner import run_job
from workers.launcher.runtime import allocate_runtime, release_runtime
from workers.launcher.spare import Spare
from workers.launcher.venv import ensure_venv

USER_MODULE = """\
import json, os, socket, time
import torch, numpy
_s = socket.socket(socket.AF_UNIX)
_s.connect(os.environ["AUTOPILOT_EVENTS"])
_s.sendall(json.dumps({"type": "started", "at": time.time()}).encode() + b"\\n")
json.dump({"torch": torch.__version__}, open(os.environ["AUTOPILOT_RESULT"], "w"))
"""
SETTLE_S = 5.0  # a spare starts while the previous job runs: let it finish its imports


def main() -> None:
    ap = bench_parser(__doc__, quick="3 rounds instead of 10")
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 10)
    work = Path(tempfile.mkdtemp(prefix="ap-parked-"))
    sides: dict[str, list[float]] = {"cold": [], "parked": [], "parked_preload": []}
    try:
        venv = ensure_venv(work / "state", "bench", [], system_site_packages=True)
        worktree = work / "wt"
        worktree.mkdir()
        (worktree / "bench_torch.py").write_text(USER_MODULE)
        base_env = dict(os.environ)
        for _ in range(args.rounds):
            for side, times in sides.items():
                rt = allocate_runtime(state_dir=work / "state", env=base_env)
                job = module_job(venv.path, "bench_torch", worktree, rt, base_env)
                spare = None
                if side != "cold":
                    preload = ["torch", "numpy"] if side == "parked_preload" else []
                    spare = Spare(
                        venv=venv.path,
                        runtime=rt,
                        base_env=base_env,
                        cuda_visible_devices="",
                        preload=preload,
                    )
                    time.sleep(SETTLE_S)
                marks: dict[str, float] = {}
                try:
                    out = run_job(
                        job,
                        spare=spare,
                        on_spawn=lambda pid, pgid, m=marks: m.setdefault("go", time.time()),
                        on_event=lambda e, m=marks: m.setdefault("first", float(e["at"])),
                    )
                finally:
                    if spare is not None:
                        spare.close()
                    release_runtime(rt)
                if not out.ok or "first" not in marks:
                    raise SystemExit(f"{side}: the job failed: {out.stderr[-2000:]}")
                if out.launch != ("cold" if side == "cold" else "spare"):
                    raise SystemExit(f"{side}: launched {out.launch}: {out.spare_missed}")
                times.append(marks["first"] - marks["go"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {side: statistics.median(times) for side, times in sides.items()}
    result: dict[str, Any] = {
        "benchmark": "parked_start",
        "rounds": args.rounds,
        "first_line_ms": {side: round(v * 1000, 1) for side, v in med.items()},
        "baseline": "cold: <venv>/bin/python -m <entry>, spawn to first line",
        "ratio_parked": round(med["parked"] / med["cold"], 3),
        "ratio_parked_preload": round(med["parked_preload"] / med["cold"], 4),
        "machine": machine("cpu", "cores", "python"),
        "date": today(),
    }
    emit(result, args.json)


if __name__ == "__main__":
    main()
