"""A job's venv, prepared for real: built by uv with its progress in the job's log, and its
environment record (key, installer, lock) kept by the preparation, taken by the job at lease and
shown by the API and `autopilot job show`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import git
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from app.api.main import create_app
from app.cli.jobs import job_app
from app.db import Stores
from app.jobs import paths, preparation
from app.jobs import service as jobs
from app.projects import service as ops
from tests.integration.queue.conftest import Workers, make_repo
from tests.integration.queue.test_job_cli import cli_env
from tests.integration.queue.test_workers import finished, submit
from tests.support import wait_for
from workers import prepare


def test_a_prepared_job_logs_its_venv_build_and_carries_its_lock(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    # A venv root of its own: this preparation builds the venv (the shared one may hold it).
    settings = workers.settings.model_copy(update={"venv_root": tmp_path / "own-venvs"})
    repo = make_repo(tmp_path, "probe-env")
    job_id = submit(stores, workers, repo, sleep_s=0.05)
    workers.start_api()  # the preparation fetches the job's commit from the control host
    assert prepare.prepare_job(stores, settings, job_id, host="host-env")

    log = paths.log_path(settings, job_id).read_text()
    building = re.findall(r"^\[venv\] building venv: (\d+) packages, (\d+) s$", log, re.M)
    built = re.findall(r"^\[venv\] built venv: (\d+) packages, (\d+) s$", log, re.M)
    assert building and len(built) == 1, log
    assert int(built[0][0]) >= 2  # the harness and numpy at least, as uv counted them

    with stores.ops_session() as session:
        row = preparation.preparation_on(session, job_id, "host-env")
        assert row is not None and row.environment is not None
        record = dict(row.environment)
    assert record["installer"] == "uv" and record["built_now"] is True
    assert record["venv"] == row.venv_path
    lock = record["lock"]
    assert any(line.startswith("autopilot-harness @ file://") for line in lock), lock
    assert any(re.fullmatch(r"numpy==[\w.]+", line) for line in lock), lock
    assert not any(line.startswith("torch") for line in lock)  # inherited, never installed
    assert "uv = " in (Path(row.venv_path or "") / "pyvenv.cfg").read_text()

    with stores.ops_session() as session:  # the job takes the record where it is leased
        leased = jobs.lease_next(
            session, settings, queue="gpu.cpu", worker="w@host-env", device="", host="host-env"
        )
        assert leased is not None and leased.id == job_id
        assert leased.environment == record

    with stores.ops_session() as session:
        _, admin = ops.create_token(session, "env-reader", ["admin"])
    with TestClient(create_app(settings, stores)) as client:
        shown = client.get(f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {admin}"})
    assert shown.status_code == 200, shown.text
    assert shown.json()["environment"]["lock"] == lock

    out = CliRunner().invoke(job_app, ["show", str(job_id), "--json"], env=cli_env(settings))
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["environment"]["lock"] == lock


def test_harness_progress_reads_run_i_of_n_in_the_job_log(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "probe-progress")
    main = repo / "probe" / "main.py"
    # The harness's own progress events, as `autopilot_harness.experiment._compare` sends them.
    main.write_text(
        main.read_text().replace(
            'send({"type": "started"})\n',
            'send({"type": "started"})\n'
            + "".join(
                f'send({{"type": "progress", "stage": "timing", "done": {i}, "total": 3}})\n'
                for i in (1, 2, 3)
            ),
        )
    )
    git.Repo(repo).index.add(["probe/main.py"])
    git.Repo(repo).index.commit("probe reports its progress")
    job_id = submit(stores, workers, repo, sleep_s=0.05)
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    done = wait_for(lambda: finished(stores, job_id), timeout=120)
    assert done.state == "succeeded", (done.error, workers.logs())
    log = Path(done.log_path or "").read_text()
    assert [f"[progress] run {i}/3 (timing)" for i in (1, 2, 3)] == [
        line for line in log.splitlines() if line.startswith("[progress]")
    ], log
