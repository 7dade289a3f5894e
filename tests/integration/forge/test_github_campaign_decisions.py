"""Decisions taken on GitHub on a campaign's line reach research memory once, as a cycle's do:
the PR merged approves the campaign (its findings validated), closed rejects it with the last
note, an `/autopilot approve` command decides it, and the reconciliation applies what no webhook
delivered (docs/design.md, "Research lines")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.cycles.campaigns.models import Campaign
from app.db import Stores
from app.forge import decisions
from app.memory import service as memory
from app.memory.schemas import FindingCreate
from app.projects import service as ops
from app.settings import Settings
from tests.integration.forge.decisions_world import PROJECT, World, deliver, github_settings
from tests.integration.forge.github_fake import FakeGitHub, serve


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    with serve() as server:
        yield server


@pytest.fixture
def gh_settings(tmp_path: Path, settings: Settings, fake: FakeGitHub) -> Settings:
    return github_settings(tmp_path, settings, fake)


@pytest.fixture
def world(gh_settings: Settings, stores: Stores, fake: FakeGitHub) -> World:
    return World(gh_settings, stores, fake)


@pytest.fixture
def client(gh_settings: Settings, stores: Stores) -> Iterator[TestClient]:
    with TestClient(create_app(gh_settings, stores)) as client:
        yield client


@dataclass
class Line:
    campaign_id: int
    number: int
    finding_ids: list[str]


def ended_campaign(world: World) -> Line:
    """A finished campaign whose line's PR is open on GitHub, with its findings proposed."""
    pr = world.fake.add_pull(f"autopilot/{PROJECT}/campaign-{uuid.uuid4().hex[:6]}")
    with world.stores.ops_session() as session:
        project = ops.get_project(session, PROJECT)
        campaign = Campaign(
            project_id=project.id,
            state="finished",
            max_cycles=2,
            parallel=1,
            round=2,
            stop_requested=False,
            start_sha="a" * 40,
            tip_sha="b" * 40,
            pr_number=pr["number"],
            pr_url=pr["html_url"],
        )
        session.add(campaign)
        session.flush()
        campaign_id = campaign.id
    with world.stores.memory_session() as msession:
        ids = [
            memory.create(
                msession,
                FindingCreate(
                    project=PROJECT,
                    kind="verdict",
                    statement=f"{what} (campaign {campaign_id})",
                    source=pr["html_url"],
                    source_status="verified",
                ),
                f"campaign-{campaign_id}",
            ).id
            for what in ("step: faster, kept", "cumulative: faster")
        ]
    with world.stores.ops_session() as session:
        row = session.get(Campaign, campaign_id)
        assert row is not None
        row.finding_ids = ids
    return Line(campaign_id, pr["number"], ids)


def decision(world: World, line: Line) -> tuple[str | None, str | None]:
    with world.stores.ops_session() as session:
        row = session.get(Campaign, line.campaign_id)
        assert row is not None
        return row.decision, row.decided_by


def statuses(world: World, line: Line) -> list[tuple[str, str | None]]:
    with world.stores.memory_session() as msession:
        found = [memory.get(msession, fid) for fid in line.finding_ids]
        return [(f.status, f.validated_by) for f in found]


def test_a_merge_on_github_approves_the_campaign_once(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    line = ended_campaign(world)
    fake.merge_on_github(line.number, by="carol")
    payload = fake.webhook_payload("pull_request", line.number, sender="carol")
    status, answer, _ = deliver(client, "pull_request", payload)
    assert status == 200 and f"campaign {line.campaign_id} approved" in answer["outcome"], answer
    assert decision(world, line) == ("approved", "carol")
    assert statuses(world, line) == [("validated", "carol")] * 2
    # Another delivery of the same decision, and the reconciliation: nothing twice.
    status, answer, _ = deliver(client, "pull_request", payload)
    assert status == 200 and "decided already" in answer["outcome"], answer
    assert decisions.reconcile(world.stores, world.settings) == []


def test_a_close_on_github_rejects_the_campaign_with_the_last_note(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    line = ended_campaign(world)
    fake.comment_on_github(line.number, "erin", "The second step is inside the noise here")
    fake.close_on_github(line.number, by="erin")
    payload = fake.webhook_payload("pull_request", line.number, sender="erin")
    status, answer, _ = deliver(client, "pull_request", payload)
    assert status == 200, answer
    assert decision(world, line) == ("rejected", "erin")
    with world.stores.memory_session() as msession:
        for fid in line.finding_ids:
            trail = memory.history(msession, fid)
            assert trail[-1].to_status == "refuted"
            assert trail[-1].reason == "The second step is inside the noise here"


def test_the_approve_command_decides_the_campaign(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    line = ended_campaign(world)
    fake.permissions["dave"] = "write"
    comment = fake.comment_on_github(line.number, "dave", "/autopilot approve\nBoth hold")
    payload = fake.webhook_payload("issue_comment", line.number, comment=comment)
    status, answer, _ = deliver(client, "issue_comment", payload)
    assert status == 200, answer
    assert decision(world, line) == ("approved", "dave")
    assert statuses(world, line) == [("validated", "dave")] * 2
    posted = [c["body"] for c in fake.comments[line.number] if c["user"]["login"] == fake.bot]
    assert len(posted) == 1 and posted[0].startswith("Approved by dave.\n\nBoth hold"), posted
    # A rerun asked on a campaign's line is acknowledged and ignored: a line is not a cycle.
    rerun = fake.comment_on_github(line.number, "dave", "/autopilot rerun")
    payload = fake.webhook_payload("issue_comment", line.number, comment=rerun)
    status, answer, _ = deliver(client, "issue_comment", payload)
    assert status == 202 and "ignored" in answer["outcome"], answer


def test_the_reconciliation_decides_a_campaign_no_webhook_reached(world: World) -> None:
    merged, still_open = ended_campaign(world), ended_campaign(world)
    world.fake.merge_on_github(merged.number, by="carol")
    done = decisions.reconcile(world.stores, world.settings)
    assert done == [f"campaign {merged.campaign_id} approved by carol"], done
    assert decision(world, merged) == ("approved", "carol")
    assert decision(world, still_open) == (None, None)
    assert decisions.reconcile(world.stores, world.settings) == []
