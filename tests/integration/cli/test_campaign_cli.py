"""`autopilot campaign start|list|show|stop` on the control host's stores (in process, the
settings in the environment), and from another machine through the API (a real subprocess
against the API served on loopback). A campaign's steps are built in the DB as its driver
leaves them: no workers."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner, Result

from app.api.main import create_app
from app.cli import campaigns as campaign_cli
from app.cli.main import cli
from app.cycles.campaigns import service as campaigns
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.conftest import Backend
from tests.integration.cli.test_remote import autopilot, one_line_error
from tests.integration.dashboard.test_campaign_pages import START, TIP, build_campaign, doorbells
from tests.support import served

# A verdict on measured speed: one at a time (tests/conftest.py, `timing`).
pytestmark = pytest.mark.timing


@pytest.fixture
def local(settings: Settings, stores: Stores, tmp_path: Path) -> dict[str, str]:
    """The environment of the CLI on the control host, with a project `lab`."""
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="lab", repo_url="/srv/lab"))
    return {
        "AUTOPILOT_STATE_DIR": str(settings.state_dir),
        "AUTOPILOT_OPS_URL": settings.ops_database_url,
        "AUTOPILOT_MEMORY_URL": settings.memory_database_url,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),  # no saved login sends it elsewhere
    }


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(cli, ["campaign", *args], env=env)


def refused(result: Result, needle: str) -> None:
    """Bad input: exit 2 and one line that says what was wrong."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and needle in line, line


def test_start_list_stop_on_this_hosts_stores(
    local: dict[str, str], stores: Stores, settings: Settings
) -> None:
    started = run(
        local,
        *("start", "lab", "--max-cycles", "4", "--parallel", "2"),
        *("--stop-after-no-gain", "3", "--max-hours", "1.5", "--json"),
    )
    assert started.exit_code == 0, started.output
    row = json.loads(started.stdout)
    assert (row["project"], row["state"], row["created_by"]) == ("lab", "running", "cli")
    assert (row["max_cycles"], row["parallel"], row["stop_after_no_gain"], row["max_hours"]) == (
        4,
        2,
        3,
        1.5,
    )
    # after the commit, the driver's doorbell names the stored campaign
    assert doorbells(settings) == [("autopilot.advance_campaign", f"[{row['id']}]")]

    plain = run(local, "start", "lab")  # the API's defaults, said as the show command says it
    assert plain.exit_code == 0, plain.output
    assert "steps        0 of at most 10, 0 kept" in plain.stdout
    listed = run(local, "list", "--json")
    assert [c["id"] for c in json.loads(listed.stdout)] == [row["id"] + 1, row["id"]]
    table = run(local, "list", "--project", "lab").stdout.splitlines()
    assert table[0].split()[:5] == ["ID", "PROJECT", "STATE", "STEPS", "KEPT"]
    assert table[2].split()[:5] == [str(row["id"]), "lab", "running", "0/4", "0"]
    none = run(local, "list", "--state", "finished")
    assert none.exit_code == 0 and none.stdout == ""
    assert "no campaigns match --state finished" in none.stderr

    stopped = run(local, "stop", str(row["id"]))
    assert stopped.exit_code == 0, stopped.output
    assert stopped.stdout.startswith(f"stopping campaign {row['id']}: no new step starts")
    with stores.ops_session() as session:
        campaign = campaigns.get(session, row["id"])
        assert campaign.stop_requested and campaign.end_reason == "stopped by cli"
    assert len(doorbells(settings)) == 3  # two starts, one stop
    shown = json.loads(run(local, "show", str(row["id"]), "--json").stdout)
    assert shown["stop_requested"] is True and shown["end_reason"] == "stopped by cli"


def test_show_prints_each_step_the_cumulative_result_and_the_pull_request(
    local: dict[str, str], stores: Stores
) -> None:
    line = build_campaign(stores, ended=True, hypothesis="Tiling by 64 helps")
    shown = run(local, "show", str(line.campaign_id))
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert "state        finished" in lines
    assert f"line         autopilot/line-probe/line-{line.campaign_id}" in lines
    assert f"start        {START}" in lines and f"tip          {TIP}" in lines
    assert "steps        3 of at most 6, 1 kept" in lines
    assert (
        f"cumulative   ratio 0.800 [0.770, 0.830] (tip / start), faster, cycle {line.final}"
        in lines
    )
    assert "pr_url       local://line-probe/pulls/7" in lines
    header = next(i for i, text in enumerate(lines) if text.startswith("CYCLE"))
    assert lines[header].split()[:5] == ["CYCLE", "ROUND", "STATE", "OUTCOME", "REASON"]
    rows = {text.split()[0]: text for text in lines[header + 1 :]}
    kept = rows[str(line.kept)]
    assert kept.split()[1:4] == ["1", "judged", "kept"]
    assert "0.810 [0.780, 0.840]" in kept and str(line.confirmation) in kept
    assert "Fusing the loop halves the time" in kept and "confirmed on fresh blocks" in kept
    dropped = rows[str(line.discarded)]
    assert dropped.split()[1:5] == ["1", "judged", "discarded", "self_reported"]
    assert "0.500 [0.450, 0.550]" in dropped and "Tiling by 64 helps" in dropped
    assert rows[str(line.judging)].split()[1:4] == ["2", "cancelled", "-"]

    data = json.loads(run(local, "show", str(line.campaign_id), "--json").stdout)
    assert [s["outcome"] for s in data["steps"]] == ["kept", "discarded", None]
    assert data["cumulative"]["ratio"] == 0.8 and data["pr_url"] == "local://line-probe/pulls/7"


def test_bad_input_is_one_line_naming_what_was_wrong(
    local: dict[str, str], stores: Stores, settings: Settings
) -> None:
    refused(
        run(local, "start", "nope"),
        "no project named 'nope'; list them with `autopilot project list`",
    )
    refused(
        run(local, "start", "lab", "--max-cycles", "0", "--parallel", "65"),
        "--max-cycles: Input should be greater than or equal to 1; --parallel: Input should be "
        "less than or equal to 64",
    )
    refused(run(local, "start", "lab", "--agent", "wizard"), "unknown agent 'wizard'")
    with stores.ops_session() as session:
        assert list(campaigns.list_campaigns(session)) == []
    assert doorbells(settings) == []  # nothing stored, nothing rung

    for command in ("show", "stop"):
        refused(
            run(local, command, "999"), "no campaign 999; list them with `autopilot campaign list`"
        )
    refused(run(local, "list", "--project", "nope"), "no project named 'nope'")
    refused(run(local, "list", "--state", "done"), "--state 'done' is not a campaign's state")
    ended = build_campaign(stores, ended=True)
    refused(
        run(local, "stop", str(ended.campaign_id)),
        f"campaign {ended.campaign_id} has already ended (finished)",
    )


@pytest.mark.parametrize(("end", "code"), [("finished", 0), ("failed", 1)])
def test_wait_follows_the_campaign_until_it_ends(
    local: dict[str, str],
    stores: Stores,
    monkeypatch: pytest.MonkeyPatch,
    end: str,
    code: int,
) -> None:
    """Between two polls the driver moves the campaign: a round, then its end."""

    def driver_moves(_seconds: float) -> None:
        with stores.ops_session() as session:
            (campaign,) = campaigns.list_campaigns(session)
            if campaign.round == 0:
                campaign.round = 1
            else:
                campaign.state = end
                campaign.error = "the line could not be made" if end == "failed" else None

    monkeypatch.setattr(campaign_cli, "time", SimpleNamespace(sleep=driver_moves))
    waited = run(local, "start", "lab", "--wait")
    assert waited.exit_code == code, waited.output
    said = waited.stderr.splitlines()
    assert [s.split(": ", 1)[1] for s in said] == [
        "running, round 0, 0 step(s), 0 kept",
        "running, round 1, 0 step(s), 0 kept",
    ]
    assert f"state        {end}" in waited.stdout.splitlines()


@pytest.fixture
def control(backend: Backend, settings: Settings, stores: Stores) -> Iterator[tuple[str, str]]:
    """The control host's API on loopback with a project `lab`, and a trigger token. Once, on
    the embedded stores, as the other remote CLI tests (real processes: slow)."""
    if backend.name != "sqlite":
        pytest.skip("the remote CLI tests run once, with the embedded stores")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="lab", repo_url="/srv/lab"))
        token = ops.create_token(session, "alice", ["trigger"])[1]
    with served(create_app(settings, stores)) as url:
        yield url, token


def test_the_commands_go_through_the_api_from_another_machine(
    control: tuple[str, str], stores: Stores, settings: Settings, tmp_path: Path
) -> None:
    url, token = control
    laptop = tmp_path / "laptop"
    laptop.mkdir()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return autopilot(laptop, "--api", url, "--token", token, "campaign", *args)

    started = cli("start", "lab", "--max-cycles", "3", "--json")
    assert started.returncode == 0, started.stderr
    row = json.loads(started.stdout)
    assert (row["project"], row["state"], row["max_cycles"], row["created_by"]) == (
        "lab",
        "running",
        3,
        "alice",
    )
    assert doorbells(settings) == [("autopilot.advance_campaign", f"[{row['id']}]")]
    assert [c["id"] for c in json.loads(cli("list", "--json").stdout)] == [row["id"]]
    shown = cli("show", str(row["id"]))
    assert "steps        0 of at most 3, 0 kept" in shown.stdout.splitlines()
    stopped = cli("stop", str(row["id"]))
    assert stopped.returncode == 0 and stopped.stdout.startswith(f"stopping campaign {row['id']}")
    with stores.ops_session() as session:
        assert campaigns.get(session, row["id"]).end_reason == "stopped by alice"

    one_line_error(cli("show", "999"), "no campaign 999; list them with `autopilot campaign list`")
    one_line_error(cli("start", "nope"), "no project named 'nope'")
    one_line_error(cli("start", "lab", "--parallel", "0"), "--parallel: Input should be")
    assert not (laptop / "state").exists()  # the laptop's own stores were never touched
