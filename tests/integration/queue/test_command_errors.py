"""A command experiment's runs that give no value fail the job, naming the run or the key and
showing the run's last lines; nothing is recorded as a result. Real worker processes, a real
sandbox."""

from __future__ import annotations

import textwrap
from pathlib import Path

import git
import pytest

from app import broker
from app.db import Stores
from app.jobs import service as jobs
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.conftest import Backend
from tests.integration.queue.conftest import Workers
from tests.integration.queue.test_workers import finished
from tests.support import wait_for

SCRIPT = """
import sys
mode = sys.argv[1]
print("loading the data")
if mode == "exit":
    print("Traceback: the dataset is missing", file=sys.stderr)
    sys.exit(3)
if mode == "text":
    print("time fastms")
if mode == "quiet":
    print("done, nothing measured")
if mode == "ok":
    print("time 1.5ms")
"""

EXPERIMENT = """
[experiments.{name}]
kind = "command"
command = ["python", "run.py", "{mode}"]
metric = "step_ms"
{metric}
repeats = 2
time_limit_s = 60
{extra}
"""
PATTERN = "metric_pattern = 'time (?P<value>\\S+)ms'"


@pytest.fixture
def queue_sandbox() -> str:
    return "on"


def project(root: Path) -> Path:
    repo_dir = root / "broken-runs"
    repo_dir.mkdir()
    (repo_dir / "run.py").write_text(textwrap.dedent(SCRIPT))
    cases = [
        ("exits", "exit", PATTERN, ""),
        ("words", "text", PATTERN, ""),
        ("silent", "quiet", PATTERN, ""),
        ("nofile", "ok", 'metric_file = "metrics.json"\nmetric_key = "loss"', ""),
        ("setup", "ok", PATTERN, 'setup = ["python", "run.py", "exit"]'),
    ]
    text = '[project]\nname = "broken-runs"\ngpu_kind = "cpu"\n' + "".join(
        EXPERIMENT.format(name=n, mode=m, metric=metric, extra=extra)
        for n, m, metric, extra in cases
    )
    (repo_dir / "autopilot.toml").write_text(text)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["run.py", "autopilot.toml"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("a script that fails", author=actor, committer=actor)
    return repo_dir


def test_each_failing_run_fails_its_job_with_the_run_and_its_last_lines(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one back end: the runner's errors do not depend on the stores")
    repo = project(tmp_path)
    cfg = project_config.load(repo)
    with stores.ops_session() as session:
        row = ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        ids = {
            name: jobs.submit(session, workers.settings, row, cfg, name, {}).id
            for name in ("exits", "words", "silent", "nofile", "setup")
        }
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    broker.ring_gpu(workers.settings, "gpu.cpu")
    done = {name: wait_for(lambda i=i: finished(stores, i), timeout=180) for name, i in ids.items()}
    for name, job in done.items():
        assert job.state == "failed", (name, job.error, workers.logs())
        assert job.result is None, name  # nothing to judge: no verdict can follow
    errors = {name: str(job.error) for name, job in done.items()}
    assert "run 1/6 (" in errors["exits"] and "python run.py exit) exited with 3" in errors["exits"]
    assert "Traceback: the dataset is missing" in errors["exits"]  # its last lines
    assert "metric_pattern matched 'fast', which is not a number" in errors["words"]
    assert (
        "metric_pattern 'time (?P<value>\\S+)ms' never matched the run's output"
        in (errors["silent"])
    )
    assert "done, nothing measured" in errors["silent"]
    assert "metric_file 'metrics.json' did not appear" in errors["nofile"]
    assert "setup python run.py exit exited with 3 in the baseline tree" in errors["setup"]
    assert "preparation failed" in errors["setup"]
    # each run's log is kept, the failing one included
    runs_dir = workers.settings.state_dir.absolute() / "jobs" / str(ids["exits"]) / "runs"
    (kept,) = list(runs_dir.iterdir())
    assert "the dataset is missing" in kept.read_text()
