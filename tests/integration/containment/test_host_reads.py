"""What the host reads or writes where untrusted code could have been first: the agent's
proposal and logs, a job's result, a venv's record of what it inherits. Each is refused when it
is a link, a FIFO or too large, or lives out of the untrusted code's reach."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.agents import workspace
from app.agents.exceptions import AgentFailed
from app.agents.service import parse_proposal
from app.agents.workspace import Workspace
from tests.integration.launcher.conftest import MakeJob, make_job  # noqa: F401 - fixture
from workers.launcher.runner import run_job
from workers.launcher.venv import Venv, inherited_site_dirs
from workers.launcher.venv_build import PARENT_VENV_PTH

SECRET = "host-secret-7f3a"


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "host-secret.json"
    path.write_text(json.dumps({"hypothesis": SECRET, "experiment": "x", "parameters": {}}))
    return path


def test_a_proposal_that_is_a_link_fifo_or_huge_is_refused(
    tmp_path: Path, secret_file: Path
) -> None:
    space = Workspace(tmp_path / "agent")
    space.reset()
    proposal = space.files / "proposal.json"
    proposal.symlink_to(secret_file)
    with pytest.raises(AgentFailed, match="not a plain file") as caught:
        parse_proposal(proposal)
    assert SECRET not in str(caught.value)
    proposal.unlink()
    os.mkfifo(proposal)  # reading it would hang the control worker
    with pytest.raises(AgentFailed, match="not a plain file"):
        parse_proposal(proposal)
    proposal.unlink()
    proposal.write_bytes(b" " * (workspace.MAX_PROPOSAL_BYTES + 1))
    with pytest.raises(AgentFailed, match="larger than"):
        parse_proposal(proposal)


def test_the_logs_the_host_writes_are_out_of_the_agents_reach(tmp_path: Path) -> None:
    space = Workspace(tmp_path / "agent")
    space.reset()
    for log in (space.output_log, space.pack_log):
        assert not log.is_relative_to(space.work)  # the only dir bound into its sandbox


def test_a_result_that_is_a_link_is_not_read(
    make_job: MakeJob,  # noqa: F811 - the fixture
    secret_file: Path,
) -> None:
    job = make_job(
        f"""
        import os
        os.symlink({str(secret_file)!r}, os.environ["AUTOPILOT_RESULT"])
        """
    )
    outcome = run_job(job)
    assert outcome.result is None
    assert "not a plain file" in (outcome.result_error or "")
    assert SECRET not in (outcome.result_error or "") + outcome.stdout + outcome.stderr


def test_what_a_venv_inherits_is_read_from_its_build_record(venv: Venv, tmp_path: Path) -> None:
    recorded = inherited_site_dirs(venv.path)
    pth = next(venv.path.glob(f"lib/python*/site-packages/{PARENT_VENV_PTH}"), None)
    if pth is None:
        pytest.skip("this venv inherits nothing (its base is not a venv)")
    original = pth.read_text()
    try:
        # What a requirement's build could write while the venv was writable to it.
        pth.write_text(original + f"{tmp_path}\n/root\n")
        assert inherited_site_dirs(venv.path) == recorded
        assert str(tmp_path) not in recorded
    finally:
        pth.write_text(original)
