"""Launch overhead: time to the first line of user code through the runner, against bare Python.

"Ours" is the launch path a GPU worker takes once the venv exists and the guard has passed
before: allocate the runtime dir, build the job's environment, check the guard (a cache hit),
spawn `<venv>/bin/python -m bench_user` through the runner. It ends at the first line of the
user module, which reads the monotonic clock (system-wide on Linux) and sends it as the
`started` event. The baseline is the whole of `<venv>/bin/python -c pass`, start to exit.
Pairs are interleaved with the order alternating; figures are medians.

    python bench/launch.py [--quick] [--json] [--sandbox] [--no-cgroup]

Each launch of ours runs in a cgroup of its own named for this process, as a GPU worker's jobs
do wherever the host has a writable cgroup v2. There a GPU worker keeps an **exec stub**
(`workers/launcher/execstub.py`) waiting in a fresh cgroup of its own, started while it is idle
or the previous job runs; a cold job is exec'd by it and needs no cgroup move. "Ours" is that
path: the stub is started and settled before the clock starts. The path without a stub (vfork,
then the worker moves the job into `job-0.w<pid>` while it starts; the worker's death watch,
`workers/launcher/deathwatch.py`) is measured in the same run, interleaved, as `no_stub_*`.
`--no-cgroup` measures the fallback of a host without one (a preexec_fn that sets
PR_SET_PDEATHSIG: fork).
`--sandbox`: every launch of ours under bubblewrap (a GPU worker's default); the baseline
stays bare Python, so the sandbox's cost shows in the difference between runs.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import bench_parser, emit, machine, module_job, today

from workers.launcher import confine, execstub
from workers.launcher.guard import run_guard
from workers.launcher.runner import Limits, run_job
from workers.launcher.runtime import allocate_runtime, release_runtime
from workers.launcher.spare import Spare
from workers.launcher.venv import ensure_venv

GOAL = 1.25
USER_MODULE = """\
import time; _FIRST_LINE = time.monotonic()
import json, os, socket
if "AUTOPILOT_EVENTS" in os.environ:
    _s = socket.socket(socket.AF_UNIX)
    _s.connect(os.environ["AUTOPILOT_EVENTS"])
    _s.sendall(json.dumps({"type": "started", "t": _FIRST_LINE}).encode() + b"\\n")
    _s.close()
else:  # the `-m` reference run without the runner
    os.write(1, repr(_FIRST_LINE).encode())
"""


def main() -> None:
    ap = bench_parser(__doc__, quick="20 pairs instead of 60")
    ap.add_argument("--sandbox", action="store_true", help="launch under bubblewrap")
    ap.add_argument("--no-cgroup", action="store_true", help="no cgroup: the fallback path")
    args = ap.parse_args()
    pairs = 20 if args.quick else 60

    work = Path(tempfile.mkdtemp(prefix="ap-bench-"))
    try:
        venv = ensure_venv(work / "state", "bench", [])
        worktree = work / "wt"
        worktree.mkdir()
        (worktree / "bench_user.py").write_text(USER_MODULE)
        cache = work / "state" / "guard-cache"
        base_env = dict(os.environ)

        def launch(
            check_cached: bool, parked: bool = False, stub: bool = False
        ) -> tuple[float, float, float]:
            """One launch: (first line - start, prep time, spawn-to-first-line).

            `parked`: as a GPU worker's second and later jobs run, handed to an interpreter
            parked ahead of time (`Spare`, started and settled before the clock starts).
            `stub`: a cold start exec'd by the worker's stub (started and settled before the
            clock starts); else a cold start without one."""
            first: list[float] = []
            spare: Spare | None = None
            if stub and not (execstub.prepare() and execstub.wait_ready(10.0)):
                raise SystemExit("no exec stub could be started here")
            if not stub:
                execstub.discard()
            if parked:
                rt = allocate_runtime(state_dir=work / "state", env=base_env)
                spare = Spare(
                    venv=venv.path,
                    runtime=rt,
                    cuda_visible_devices="",
                    base_env=base_env,
                    requirements_hash=venv.requirements_hash,
                    sandboxed=args.sandbox,
                    workdir=worktree,
                    # parked in the cgroup of the job it is for, as a GPU worker parks it
                    cgroup_name=None if args.no_cgroup else confine.job_cgroup_name(0),
                )
                time.sleep(0.15)  # let it finish starting: on a worker it started a job ago
            t0 = time.monotonic()
            if not parked:
                rt = allocate_runtime(state_dir=work / "state", env=base_env)
            try:
                job = module_job(
                    venv.path,
                    "bench_user",
                    worktree,
                    rt,
                    base_env,
                    venv.requirements_hash,
                    sandboxed=args.sandbox,
                    cgroup=not args.no_cgroup,
                )
                report = run_guard(
                    venv.path,
                    env=job.env(),
                    cwd=worktree,
                    entry="bench_user",
                    worktree=worktree,
                    requirements_hash=venv.requirements_hash,
                    cache_dir=cache,
                )
                if not report.ok:
                    raise SystemExit(report.render())
                if check_cached and not report.cached:
                    raise SystemExit("the guard cache was cold on a warm launch")
                t_spawn = time.monotonic()
                out = run_job(
                    job,
                    limits=Limits(timeout_s=60),
                    on_event=lambda e: first.append(float(e["t"])),
                    spare=spare,
                )
            finally:
                if spare is not None:
                    spare.close()
                release_runtime(rt)
            if out.returncode != 0 or not first:
                raise SystemExit(f"user module failed: {out.stderr}")
            if out.launch != ("spare" if parked else "stub" if stub else "cold"):
                raise SystemExit(f"launched {out.launch}: {out.spare_missed}")
            return first[0] - t0, t_spawn - t0, first[0] - t_spawn

        m_env = {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONSAFEPATH": "1",
            "PYTHONPATH": str(worktree),
        }

        def bare_m() -> float:
            """Reference, not the baseline: plain `python -m` to its first line, no runner."""
            t0 = time.monotonic()
            out = subprocess.run(
                [str(venv.python), "-m", "bench_user"],
                env=m_env,
                cwd=worktree,
                capture_output=True,
                check=True,
            )
            return float(out.stdout) - t0

        def bare() -> float:
            t0 = time.monotonic()
            subprocess.run([str(venv.python), "-c", "pass"], check=True)
            return time.monotonic() - t0

        probe = None if args.no_cgroup else confine.open_cgroup("bench-probe", required=False)
        cgroup_used = probe is not None
        if probe is not None:
            probe.remove()
        # A GPU worker's cold path: the exec stub where the host has a cgroup for the job and
        # no sandbox (`staging.takes_stub`); elsewhere there is no stub and no second row.
        stubbed = cgroup_used and not args.sandbox
        t_cold = time.monotonic()
        launch(check_cached=False)  # fills the guard cache (a cold guard run)
        guard_cold_s = time.monotonic() - t_cold
        for _ in range(3):  # warm the page cache for every side
            launch(check_cached=True, stub=stubbed)
            launch(check_cached=True)
            bare()
        ours: list[float] = []
        prep: list[float] = []
        spawn: list[float] = []
        base: list[float] = []
        no_stub: list[float] = []
        plain_m: list[float] = []
        warm: list[float] = []
        # 0: ours, 1: the baseline, 2: the cold path without a stub; each order in turn
        orders = [(0, 1, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0), (1, 0, 2), (0, 2, 1)]
        for i in range(pairs):
            for side in orders[i % len(orders)]:
                if side == 0:
                    total, p, s = launch(check_cached=True, stub=stubbed)
                    ours.append(total)
                    prep.append(p)
                    spawn.append(s)
                elif side == 1:
                    base.append(bare())
                elif stubbed:
                    no_stub.append(launch(check_cached=True)[0])
            plain_m.append(bare_m())
            warm.append(launch(check_cached=True, parked=True)[0])
    finally:
        execstub.discard()
        shutil.rmtree(work, ignore_errors=True)

    med_ours, med_base = statistics.median(ours), statistics.median(base)
    result: dict[str, Any] = {
        "benchmark": "launch",
        "pairs": pairs,
        "first_line_s": round(med_ours, 5),
        "baseline_s": round(med_base, 5),
        "baseline": "<venv>/bin/python -c pass, start to exit",
        "ratio": round(med_ours / med_base, 3),
        "paired_ratio_median": round(
            statistics.median(o / b for o, b in zip(ours, base, strict=True)), 3
        ),
        "goal": {"ratio_max": GOAL},
        "meets_goal": med_ours / med_base <= GOAL,
        "overhead_s": round(med_ours - med_base, 5),
        "plain_m_first_line_s": round(statistics.median(plain_m), 5),
        "runner_overhead_s": round(med_ours - statistics.median(plain_m), 5),
        "prep_s": round(statistics.median(prep), 5),
        "spawn_to_first_line_s": round(statistics.median(spawn), 5),
        "guard_cold_s": round(guard_cold_s, 4),
        "no_stub_first_line_s": round(statistics.median(no_stub), 5) if no_stub else None,
        "no_stub_ratio": round(statistics.median(no_stub) / med_base, 3) if no_stub else None,
        "no_stub_paired_ratio_median": round(
            statistics.median(o / b for o, b in zip(no_stub, base, strict=True)), 3
        )
        if no_stub
        else None,
        "parked_first_line_s": round(statistics.median(warm), 5),
        "parked_ratio": round(statistics.median(warm) / med_base, 3),
        "sandbox": args.sandbox,
        "cgroup": cgroup_used,
        "cold_spawn": "exec stub"
        if stubbed
        else "preexec_fn (fork)"
        if args.sandbox or not cgroup_used
        else "vfork",
        "machine": machine("cpu", "cores", "python", "os"),
        "date": today(),
    }
    emit(result, args.json, width=24)


if __name__ == "__main__":
    sys.exit(main())
