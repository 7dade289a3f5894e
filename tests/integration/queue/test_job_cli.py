"""`autopilot job submit|list|show|cancel|logs` on the real stores, and `submit --follow` against
real workers on a real broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from app.cli.jobs import job_app, parse_param
from app.db import Stores
from app.jobs import service as jobs
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.queue.conftest import Workers, make_repo, settings_env


def cli_env(settings: Settings) -> dict[str, str]:
    return {
        "AUTOPILOT_STATE_DIR": str(settings.state_dir),
        "AUTOPILOT_OPS_URL": settings.ops_database_url,
        "AUTOPILOT_MEMORY_URL": settings.memory_database_url,
        "AUTOPILOT_BROKER_URL": settings.broker_url,
        "AUTOPILOT_MAX_JOB_TIME_LIMIT_S": str(settings.max_job_time_limit_s),
    }


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(job_app, list(args), env=env)


@pytest.fixture
def project(stores: Stores, tmp_path: Path) -> str:
    repo = make_repo(tmp_path / "repos", "probe-cli")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="probe-cli", repo_url=str(repo)))
    return "probe-cli"


def doorbells(settings: Settings) -> list[Path]:  # the job's GPU queue: its hosts prepare it
    return sorted((settings.broker_dir / "queue").glob("*.gpu.cpu.msg"))


def test_param_values_are_json_scalars_when_they_can_be() -> None:
    assert parse_param("sleep_s=0.5") == ("sleep_s", 0.5)
    assert parse_param("n=3") == ("n", 3)
    assert parse_param("fast=true") == ("fast", True)
    assert parse_param("name=fft") == ("name", "fft")
    assert parse_param('name="3"') == ("name", "3")
    assert parse_param("shape=[1,2]") == ("shape", "[1,2]")
    assert parse_param("expr=a=b") == ("expr", "a=b")


def test_submit_list_show_cancel(settings: Settings, stores: Stores, project: str) -> None:
    env = cli_env(settings)
    made = run(
        env,
        "submit",
        "--project",
        project,
        "--experiment",
        "probe",
        "--param",
        "sleep_s=0.5",
        "--json",
    )
    assert made.exit_code == 0, made.output
    job = json.loads(made.stdout)
    assert (job["state"], job["queue"], job["project"]) == ("queued", "gpu.cpu", project)
    assert job["parameters"] == {"sleep_s": 0.5, "grandchild": 0}
    assert len(doorbells(settings)) == 1

    plain = run(env, "submit", "--project", project, "--experiment", "probe", "--queue", "gpu.h100")
    assert plain.exit_code == 0 and plain.stdout.startswith(f"submitted job {job['id'] + 1}:")

    listed = run(env, "list", "--json")
    assert [j["id"] for j in json.loads(listed.stdout)] == [job["id"] + 1, job["id"]]
    table = run(env, "list", "--queue", "gpu.cpu")
    lines = table.stdout.splitlines()
    assert len(lines) == 2 and lines[1].split()[:3] == [str(job["id"]), "queued", "gpu.cpu"]
    assert "preparing" in lines[1]
    assert json.loads(run(env, "list", "--state", "running", "--json").stdout) == []

    shown = run(env, "show", str(job["id"]), "--json")
    assert json.loads(shown.stdout)["log_path"].endswith(f"jobs/{job['id']}/job.log")
    assert "sleep_s" in run(env, "show", str(job["id"])).stdout

    cancelled = run(env, "cancel", str(job["id"]))
    assert cancelled.exit_code == 0 and cancelled.stdout.strip() == f"cancelled job {job['id']}"
    with stores.ops_session() as session:
        assert jobs.get(session, job["id"]).cancelled_by == "cli"
    again = run(env, "cancel", str(job["id"]))
    assert again.exit_code == 2
    assert again.stderr.strip() == f"error: job {job['id']} already cancelled; nothing to cancel"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--queue", "gpu.tpu"), "unknown queue 'gpu.tpu'"),
        (("--param", "sleep_s=7"), "sleep_s=7 is outside the declared space"),
        (("--param", "lr=0.1"), "parameter 'lr' is not declared"),
        (("--param", "sleep_s"), "expected key=value"),
        (("--param", "sleep_s=0.5", "--param", "sleep_s=3"), "--param sleep_s given twice"),
        (("--experiment", "train"), "experiment 'train' is not declared"),
        (("--project", "nope"), "no project named 'nope'"),
    ],
)
def test_bad_submissions_exit_2_with_one_line(
    settings: Settings, stores: Stores, project: str, args: tuple[str, ...], needle: str
) -> None:
    base = {"--project": project, "--experiment": "probe"}
    for flag in ("--project", "--experiment"):
        if flag in args:
            base.pop(flag)
    result = run(cli_env(settings), "submit", *[x for kv in base.items() for x in kv], *args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and needle in line
    with stores.ops_session() as session:
        assert list(jobs.list_jobs(session)) == []
    assert doorbells(settings) == []


def test_time_limit_above_the_maximum_exits_2(
    settings: Settings, stores: Stores, project: str
) -> None:
    env = {**cli_env(settings), "AUTOPILOT_MAX_JOB_TIME_LIMIT_S": "60"}
    result = run(env, "submit", "--project", project, "--experiment", "probe")
    assert result.exit_code == 2 and "above the per-job limit 60" in result.stderr
    assert doorbells(settings) == []


def test_bad_lookups_exit_2(settings: Settings, stores: Stores) -> None:
    env = cli_env(settings)
    for args, needle in [
        (("show", "42"), "no job 42"),
        (("cancel", "42"), "no job 42"),
        (("logs", "42"), "no job 42"),
        (("list", "--state", "done"), "--state 'done'"),
        (("list", "--queue", "tpu"), "unknown queue 'tpu'"),
        (("list", "--project", "nope"), "no project named 'nope'"),
    ]:
        result = run(env, *args)
        assert result.exit_code == 2, (args, result.output)
        assert needle in result.stderr, args


def test_logs_of_a_finished_job(settings: Settings, stores: Stores, project: str) -> None:
    env = cli_env(settings)
    job_id = json.loads(
        run(env, "submit", "--project", project, "--experiment", "probe", "--json").stdout
    )["id"]
    log = settings.state_dir.absolute() / "jobs" / str(job_id) / "job.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("[log] hello\nlast line without newline")
    assert run(env, "logs", str(job_id)).stdout == "[log] hello\nlast line without newline\n"
    with stores.ops_session() as session:
        jobs.cancel(session, job_id, by="alice")
    followed = run(env, "logs", str(job_id), "--follow")
    assert followed.exit_code == 1  # followed to its end, which was not a success
    assert followed.stdout == "[log] hello\nlast line without newline\n"
    assert followed.stderr.strip().endswith(f"job {job_id} cancelled by alice")


def test_submit_follow_runs_on_real_workers(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    settings = workers.settings
    repo = make_repo(tmp_path / "repos", "probe-follow")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="probe-follow", repo_url=str(repo)))
    workers.start("control", "control")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    env = {**settings_env(settings), "AUTOPILOT_STATE_DIR": str(settings.state_dir)}
    result = run(
        env,
        "submit",
        "--project",
        "probe-follow",
        "--experiment",
        "probe",
        "--param",
        "sleep_s=0.2",
        "--follow",
    )
    assert result.exit_code == 0, (result.output, workers.logs())
    progress = result.stderr
    assert "submitted job" in progress
    assert progress.rstrip().splitlines()[-1].split("] ", 1)[1].startswith("job 1 succeeded in")
    with stores.ops_session() as session:
        assert jobs.get(session, 1).state == "succeeded"
