"""What a run's sandbox binds of the host's GPUs (only its own), and the cgroup limits it gets
from the host's `run_limits` setting: pure functions over a fake /dev listing, and the bwrap
command line they make."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.sandbox import bwrap, cgroups
from app.sandbox.cgroups import RunLimits
from workers.launcher import confine

# A host with four GPUs: what `ls /dev` shows of NVIDIA's and the DRM nodes, among others.
HOST_DEV = [
    "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidia10", "nvidiactl", "nvidia-uvm",
    "nvidia-uvm-tools", "nvidia-caps", "nvidia-modeset", "dri", "null", "zero", "sda",
]  # fmt: skip
SHARED = ["/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]


def test_a_run_gets_its_own_gpu_and_the_shared_nodes_only() -> None:
    binds = [str(p) for p in confine.gpu_binds([1], HOST_DEV)]
    assert sorted(binds) == sorted([*SHARED, "/dev/nvidia1"])


def test_two_gpus_and_an_index_that_is_a_prefix_of_another() -> None:
    binds = {str(p) for p in confine.gpu_binds([0, 1], HOST_DEV)}
    assert binds == {*SHARED, "/dev/nvidia0", "/dev/nvidia1"}  # not nvidia10
    assert "/dev/nvidia10" in {str(p) for p in confine.gpu_binds([10], HOST_DEV)}


@pytest.mark.parametrize("visible", [None, "", " "])
def test_a_run_with_no_gpu_gets_no_gpu_node(visible: str | None) -> None:
    assert confine.assigned_gpus(visible) == []
    assert confine.gpu_binds(confine.assigned_gpus(visible), HOST_DEV) == []


def test_assigned_gpus_reads_indices_in_order() -> None:
    assert confine.assigned_gpus("3,1") == [3, 1]
    assert confine.assigned_gpus("2,2") == [2]
    assert confine.assigned_gpus("GPU-8a1b,1") == [1]  # a UUID names no node


def test_inside_the_sandbox_its_gpus_are_numbered_from_zero() -> None:
    assert confine.visible_inside([1]) == "0"
    assert confine.visible_inside([3, 1]) == "1,0"  # its own order, over the host's


def bwrap_argv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, visible: str | None) -> list[str]:
    monkeypatch.setattr(confine, "_dev_names", lambda: HOST_DEV)
    venv = tmp_path / "venv"
    venv.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin"} | ({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})
    policy = confine.policy(cwd=tmp_path, venv=venv, env=env, network=False)
    return bwrap.command(["python", "-m", "exp"], policy)


def dev_binds(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dev-bind-try"]


def setenv(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--setenv" and argv[i + 1] == name:
            return argv[i + 2]
    return None


def test_the_bwrap_command_binds_only_the_workers_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    argv = bwrap_argv(monkeypatch, tmp_path, "2")
    assert sorted(dev_binds(argv)) == sorted([*SHARED, "/dev/nvidia2"])
    assert "/dev/dri" not in argv
    assert setenv(argv, "CUDA_VISIBLE_DEVICES") == "0"  # GPU 2 is the sandbox's only GPU


@pytest.mark.parametrize("visible", [None, ""])
def test_a_guard_or_setup_without_a_gpu_gets_no_device_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, visible: str | None
) -> None:
    argv = bwrap_argv(monkeypatch, tmp_path, visible)
    assert dev_binds(argv) == []
    assert not any(arg.startswith("/dev/nvidia") for arg in argv)


def test_cgroup_limits_from_the_setting() -> None:
    gib = 1 << 30
    default = confine.cgroup_limits(RunLimits(), host_memory=100 * gib)
    assert default == cgroups.Limits(pids=4096, memory=80 * gib, cpus=None)
    given = RunLimits(pids=512, memory="3G", cpus=2.5)
    assert confine.cgroup_limits(given) == cgroups.Limits(pids=512, memory=3 * gib, cpus=2.5)
    assert confine.cgroup_limits(RunLimits(memory="max", pids=None)).memory is None
    assert confine.cgroup_limits(RunLimits(memory="1048576")).memory == 1 << 20
    with pytest.raises(ValueError, match="memory"):
        RunLimits(memory="lots")


def test_limits_as_cgroup_interface_files() -> None:
    files = cgroups.Limits(pids=64, memory=1 << 20, cpus=1.5).files()
    assert files == {
        "pids.max": "64",
        "memory.max": "1048576",
        "cpu.max": "150000 100000",
        "memory.oom.group": "1",
    }
    assert cgroups.Limits().files() == {"pids.max": "max", "memory.max": "max", "cpu.max": "max"}


def test_a_limit_met_is_read_from_the_cgroups_counters(tmp_path: Path) -> None:
    # The kernel's counters, as cgroup v2 shows them; those from before the run do not count.
    cgroup = cgroups.Cgroup(tmp_path)
    for name in ("pids.max", "memory.max", "cpu.max", "memory.oom.group"):
        (tmp_path / name).write_text("")  # written in place, as cgroupfs takes it
    (tmp_path / "pids.events").write_text("max 3\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n")
    cgroup.apply(cgroups.Limits(pids=64, memory=1 << 20))
    assert cgroup.unenforced == []
    assert (tmp_path / "pids.max").read_text() == "64"
    assert cgroup.limit_hit() is None  # a cgroup taken over keeps its old counts
    (tmp_path / "pids.events").write_text("max 10\n")
    hit = cgroup.limit_hit()
    assert hit == "the run hit its process limit: 7 fork(s) refused (pids.max = 64)"
    (tmp_path / "memory.events").write_text("max 20\noom 2\noom_kill 3\n")
    hit = cgroup.limit_hit()
    assert hit is not None
    assert "its memory limit: 2 process(es) OOM-killed (memory.max = 1048576)" in hit
