"""The experiment's sandbox and cgroup: what a job's bubblewrap shows it, and how its processes
are signalled and killed as a whole (docs/design.md, "Hosts and boundaries").

A job sees its clean export (its cwd, writable: scripts write beside themselves, and the export
is a per-job throwaway copy that nothing reads back), its runtime dir, its venv and what the venv
reaches (read-only), the device nodes of its own GPUs only (`gpu_binds`), and nothing else of
the host: not the state dir, not other jobs' dirs, not the service's home or checkout, no
network unless its experiment asks. Its cgroup has the host's limits (`run_cgroup_limits`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from app.sandbox import bwrap, cgroups
from app.sandbox.exceptions import SandboxUnavailable
from app.settings import get_settings
from workers.launcher import deathwatch
from workers.launcher.runtime import RuntimeDir
from workers.launcher.venv import inherited_site_dirs

#: The first line of every job's log on a host whose sandbox is off.
UNCONFINED_LOG_LINE = "[sandbox] off: untrusted code ran unconfined (AUTOPILOT_SANDBOX=off)"
#: The GPU's device nodes (NVIDIA's and the DRM render nodes) a host may have.
GPU_DEVICE_PATTERNS = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri")
#: What every CUDA process needs besides its GPUs' own nodes: the control device, unified
#: memory and (MIG) capabilities. `nvidia<N>` is GPU N; nvidia-modeset (display) and the DRM
#: nodes (`/dev/dri`: a render node reaches any GPU of the host) are never bound.
_GPU_SHARED = re.compile(r"nvidiactl|nvidia-uvm.*|nvidia-caps")
_GPU_NODE = re.compile(r"nvidia([0-9]+)")
#: The cgroup of a job's processes on its host: named for the job and for the worker process
#: that owns it, so that two workers of a host never share one (each may park an interpreter
#: for the same job in line), and any worker can tell a dead worker's leftovers
#: (`sweep_orphans`).
JOB_CGROUP = "job-{}.w{}"
_OWNER = ".w"


def gpu_devices() -> list[Path]:
    """Every GPU device node of this host (what `autopilot doctor` reports)."""
    found = {Path(p) for pattern in GPU_DEVICE_PATTERNS for p in glob.glob(pattern)}
    return sorted(found)


def assigned_gpus(visible: str | None) -> list[int]:
    """The GPU indices of a `CUDA_VISIBLE_DEVICES` value, in its order (a worker's `--device`:
    `0`, `0,1`); unset or empty: none. An entry that is no index (a UUID) names no node."""
    entries = [entry.strip() for entry in (visible or "").split(",")]
    return list(dict.fromkeys(int(entry) for entry in entries if entry.isdigit()))


def gpu_binds(
    assigned: Sequence[int], present: Iterable[str], dev: Path = Path("/dev")
) -> list[Path]:
    """The device nodes a run on the GPUs `assigned` gets, of the names `present` in `dev`:
    nvidiactl, nvidia-uvm*, nvidia-caps and `nvidia<N>` for each assigned N only, so a run
    cannot open another worker's GPU whatever it sets CUDA_VISIBLE_DEVICES to inside. No GPU
    assigned: no node at all."""
    if not assigned:
        return []
    wanted = set(assigned)
    binds = []
    for name in sorted(set(present)):
        node = _GPU_NODE.fullmatch(name)
        if _GPU_SHARED.fullmatch(name) or (node is not None and int(node.group(1)) in wanted):
            binds.append(dev / name)
    return binds


def gpu_nodes(visible: str | None) -> list[Path]:
    """This host's device nodes for a run whose CUDA_VISIBLE_DEVICES is `visible`."""
    gpus = assigned_gpus(visible)
    return gpu_binds(gpus, _dev_names() if gpus else ())


def visible_inside(assigned: Sequence[int]) -> str:
    """`CUDA_VISIBLE_DEVICES` inside a sandbox that binds only the nodes of `assigned`: CUDA
    there enumerates only the GPUs whose nodes it can open, numbered from 0 in the host's
    order (as under Slurm's device confinement), so GPU N is no longer index N; the job's own
    order of its GPUs is kept."""
    rank = {gpu: i for i, gpu in enumerate(sorted(assigned))}
    return ",".join(str(rank[gpu]) for gpu in assigned)


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def cgroup_limits(limits: cgroups.RunLimits, host_memory: int | None = None) -> cgroups.Limits:
    """The cgroup limits of a run under the host's `run_limits` setting; `host_memory` (bytes,
    default: this host's MemTotal) is what a share such as `80%` is taken of."""
    memory: int | None = None
    if limits.memory.endswith("%"):
        total = host_memory if host_memory is not None else _host_memory()
        memory = int(total * float(limits.memory[:-1]) / 100) if total else None
    elif limits.memory != "max":
        unit = limits.memory[-1] if limits.memory[-1] in "KMG" else ""
        memory = int(limits.memory.removesuffix(unit)) * _UNITS[unit]
    return cgroups.Limits(pids=limits.pids, memory=memory, cpus=limits.cpus)


def _host_memory() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


class _Configured:
    """The cgroup limits this process gives each run's cgroup (`configure`)."""

    limits: cgroups.Limits | None = None


def configure(limits: cgroups.RunLimits) -> None:
    """Give every run's cgroup opened from now on in this process (a job's, a parked
    interpreter's, an exec stub's) the limits of `limits`: a GPU worker calls it at its start."""
    _Configured.limits = cgroup_limits(limits)


def run_cgroup_limits() -> cgroups.Limits:
    """The limits a run's cgroup gets: those `configure`d, else this process's settings' (an
    exec stub readied before the loop's start gets them too)."""
    if _Configured.limits is None:
        try:
            limits = get_settings().run_limits
        except ValueError:  # settings this process cannot read: the worker refuses to start
            limits = cgroups.RunLimits()
        _Configured.limits = cgroup_limits(limits)
    return _Configured.limits


def _dev_names() -> list[str]:
    try:
        return os.listdir("/dev")
    except OSError:
        return []


def job_cgroup_name(job_id: int) -> str:
    return JOB_CGROUP.format(job_id, os.getpid())


def spare_cgroup_name(runtime_name: str) -> str:
    return f"spare-{runtime_name}{owner_suffix()}"


def owner_suffix() -> str:
    """How the names of this worker's cgroups end (`.w<pid>`)."""
    return f"{_OWNER}{os.getpid()}"


def watched(cgroup: cgroups.Cgroup) -> bool:
    """Whether `cgroup` is killed when this worker dies, whatever kills it: it is named for this
    worker and the worker's death watch (`deathwatch.py`) runs. A job started in such a cgroup
    needs no parent-death signal of its own."""
    suffix = owner_suffix()
    return cgroup.path.name.endswith(suffix) and deathwatch.ensure(cgroup.path.parent, suffix)


def start_death_watch() -> None:
    """Start this worker's death watch ahead of its first job, so that job's launch does not
    pay for the watch's start (a host without cgroup v2 or pidfds has none: nothing happens)."""
    with contextlib.suppress(SandboxUnavailable, OSError):
        deathwatch.ensure(cgroups.cgroup_base(), owner_suffix())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def policy(
    *,
    cwd: Path,
    venv: Path,
    env: Mapping[str, str],
    network: bool,
    runtime: RuntimeDir | None = None,
    pythonpath: Sequence[Path] = (),
    writable: Sequence[Path] = (),
) -> bwrap.Policy:
    """The sandbox of one experiment process (or of its preflight guard, without a runtime)."""
    root = Path(os.path.abspath(cwd))
    venv_abs = Path(os.path.abspath(venv))
    # The venv and what it reaches: the base install is in system_read_only (sys.base_prefix);
    # a venv with system site packages over the service's venv reads that venv's packages.
    read_only = [venv_abs, *(Path(p) for p in inherited_site_dirs(venv_abs))]
    read_only += [
        p for p in (Path(os.path.abspath(e)) for e in pythonpath) if not p.is_relative_to(root)
    ]
    rw = [root, *writable]
    env = dict(env)
    # Only the run's own GPUs (its CUDA_VISIBLE_DEVICES: the worker's `--device`; none for a
    # guard or a `setup`, which run while another job has the GPU).
    gpus = assigned_gpus(env.get("CUDA_VISIBLE_DEVICES"))
    devices = gpu_binds(gpus, _dev_names() if gpus else ())
    if any(_GPU_NODE.fullmatch(node.name) for node in devices):
        # Renumbered as CUDA enumerates the bound nodes; on a host with no GPU node (CPU "GPU"
        # workers) the numbers stay the worker's own, so a job's assignment shows.
        env["CUDA_VISIBLE_DEVICES"] = visible_inside(gpus)
    links: list[tuple[str, Path]] = []
    home: Path | None = None
    if runtime is not None:
        rw.append(runtime.target)
        if runtime.path != runtime.target:
            # The short alias lives in /tmp, a tmpfs of the sandbox's own: made again inside.
            links.append((str(runtime.target), runtime.path))
        home = runtime.path  # caches a library keeps under ~ stay with the job's runtime dir
    return bwrap.Policy(
        cwd=root,
        env=env,
        read_only=read_only,
        writable=rw,
        devices=devices,
        network=network,
        symlinks=links,
        home=home,
    )


def open_cgroup(name: str, *, required: bool) -> cgroups.Cgroup | None:
    """The run's cgroup (leftovers of an earlier run under that name are killed first), with
    the run's limits (`run_cgroup_limits`); None when this host has no writable cgroup v2 and
    `required` is False (its process group is then all that is killed)."""
    try:
        return cgroups.Cgroup.create(name, limits=run_cgroup_limits())
    except SandboxUnavailable:
        if required:
            raise
        return None


def sweep_orphans() -> None:
    """Kill and remove the cgroups whose owning worker is dead (SIGKILL leaves them, with any
    process of its job that detached); a live worker's cgroups are left alone."""
    try:
        base = cgroups.Cgroup.create(f"sweep{_OWNER}{os.getpid()}")
    except SandboxUnavailable:
        return
    base.remove()
    for folder in base.path.parent.glob(f"*{_OWNER}*"):
        owner = folder.name.rsplit(_OWNER, 1)[1]
        if owner.isdigit() and not _alive(int(owner)):
            with contextlib.suppress(SandboxUnavailable, OSError):
                cgroups.Cgroup(folder).remove()


def move(processes: cgroups.Cgroup, into: cgroups.Cgroup) -> None:
    """Move every process of `processes` (a parked interpreter's, which starts nothing while
    parked) into `into`, then remove the emptied cgroup."""
    procs = into.path / "cgroup.procs"
    for pid in processes.pids():
        with contextlib.suppress(ProcessLookupError):
            procs.write_text(str(pid))
    with contextlib.suppress(OSError):
        processes.path.rmdir()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def signal_group(pgid: int, cgroup: cgroups.Cgroup | None, sig: signal.Signals) -> None:
    """Send `sig` to the whole job: every process of its cgroup, however it detached, else its
    process group. SIGTERM skips bubblewrap's own processes: bwrap does not forward it, it would
    die of it and take the job down with SIGKILL before its grace period."""
    if cgroup is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        return
    if sig == signal.SIGKILL:  # sent to all at once; whoever removes the cgroup waits
        with contextlib.suppress(SandboxUnavailable, OSError):
            cgroup.kill(wait=False)
        return
    for pid in cgroup.pids():
        if _comm(pid) != "bwrap":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
