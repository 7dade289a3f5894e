"""Decisions taken on GitHub reach research memory once: signed webhook deliveries (merge, close,
review, `/autopilot` commands) and the beat's reconciliation, against the fake GitHub server
driven by the real PyGithub client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.forge import decisions
from app.forge.webhooks import MAX_WEBHOOK_BYTES
from app.settings import Settings
from tests.integration.forge.decisions_world import (
    SECRET,
    TOKEN,
    World,
    deliver,
    github_settings,
)
from tests.integration.forge.github_fake import FakeGitHub, Fault, serve


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


def writes(fake: FakeGitHub) -> list[tuple[str, str]]:
    return [r for r in fake.requests if r[0] in ("POST", "PATCH", "PUT", "DELETE")]


def test_a_merge_on_github_approves_once_and_merges_nothing(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    made = world.cycle()
    fake.review_on_github(made.number, "dave", "APPROVED", "Clean win")
    fake.merge_on_github(made.number, by="carol")
    payload = fake.webhook_payload("pull_request", made.number, sender="carol")
    status, answer, delivery = deliver(client, "pull_request", payload)
    assert (status, answer["cycle_id"]) == (200, made.cycle_id), answer
    assert world.state(made.cycle_id) == "approved"
    findings = world.findings(made)
    assert [(s, by) for s, by, _ in findings] == [("validated", "carol")] * 2
    assert writes(fake) == []  # the merge was the reviewer's: nothing merged, closed or posted
    # GitHub's redelivery of the same delivery, then another delivery of the same decision.
    again, answer, _ = deliver(client, "pull_request", payload, delivery=delivery)
    assert again == 200 and "acted on already" in answer["outcome"]
    other, answer, _ = deliver(client, "pull_request", payload)
    assert other == 200 and "decided already" in answer["outcome"]
    assert decisions.reconcile(world.stores, world.settings) == []
    assert world.findings(made) == findings  # one validation each, not two
    assert [name for name, _ in world.steps(made.cycle_id)] == ["review"]
    assert "approved by carol on the forge" in world.steps(made.cycle_id)[0][1]


def test_a_close_on_github_rejects_with_the_last_note(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    made = world.cycle()
    fake.review_on_github(made.number, "dave", "CHANGES_REQUESTED", "Inside the noise floor")
    fake.comment_on_github(made.number, "erin", "Re-measured on the quiet box: no gain")
    fake.close_on_github(made.number, by="erin")
    payload = fake.webhook_payload("pull_request", made.number, sender="erin")
    status, answer, _ = deliver(client, "pull_request", payload)
    assert status == 200, answer
    assert world.state(made.cycle_id) == "rejected"
    for status_, _, trail in world.findings(made):
        assert status_ == "refuted"
        assert trail[-1] == ("refuted", "erin", "Re-measured on the quiet box: no gain")
    assert writes(fake) == []  # closed already: not closed again, nothing posted
    assert fake.requests.count(("GET", "/pulls/{n}/reviews")) == 1


def test_a_review_on_github_shows_on_the_cycle_and_decides_nothing(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    made = world.cycle()
    review = fake.review_on_github(made.number, "dave", "CHANGES_REQUESTED", "Add an A/A run")
    payload = fake.webhook_payload("pull_request_review", made.number, review=review)
    status, answer, delivery = deliver(client, "pull_request_review", payload)
    assert status == 200, answer
    assert deliver(client, "pull_request_review", payload, delivery=delivery)[0] == 200
    shown = client.get(
        f"/api/v1/cycles/{made.cycle_id}", headers={"Authorization": f"Bearer {world.reader}"}
    ).json()
    assert shown["state"] == "awaiting_review"
    (step,) = [s for s in shown["steps"] if s["name"] == "forge_review"]  # once, not twice
    assert step["detail"] == "changes_requested by dave: Add an A/A run"
    assert [s for s, _, _ in world.findings(made)] == ["proposed", "proposed"]
    commented = fake.review_on_github(made.number, "dave", "COMMENTED", "nit")
    payload = fake.webhook_payload("pull_request_review", made.number, review=commented)
    assert deliver(client, "pull_request_review", payload)[0] == 202


def test_approve_command_acts_as_the_dashboard(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    made = world.cycle()
    fake.permissions["frank"] = "write"
    comment = fake.comment_on_github(made.number, "frank", "/autopilot approve\nHolds on A100")
    payload = fake.webhook_payload("issue_comment", made.number, comment=comment)
    status, answer, delivery = deliver(client, "issue_comment", payload)
    assert status == 200, answer
    assert world.state(made.cycle_id) == "approved"
    assert [(s, by) for s, by, _ in world.findings(made)] == [("validated", "frank")] * 2
    posted = [c["body"] for c in fake.comments[made.number] if c["user"]["login"] == fake.bot]
    assert len(posted) == 1 and posted[0].startswith("Approved by frank.\n\nHolds on A100")
    assert ("PUT", "/pulls/{n}/merge") not in fake.requests
    assert deliver(client, "issue_comment", payload, delivery=delivery)[0] == 200
    assert deliver(client, "issue_comment", payload)[1]["outcome"].endswith("decided already")
    assert len([c for c in fake.comments[made.number] if c["user"]["login"] == fake.bot]) == 1


def test_reject_command_refutes_with_its_reason_and_closes(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    made = world.cycle()
    fake.permissions["grace"] = "admin"
    bare = fake.comment_on_github(made.number, "grace", "/autopilot reject")
    payload = fake.webhook_payload("issue_comment", made.number, comment=bare)
    status, answer, _ = deliver(client, "issue_comment", payload)
    assert status == 422 and "reason" in answer["detail"]
    assert world.state(made.cycle_id) == "awaiting_review"
    comment = fake.comment_on_github(made.number, "grace", "/autopilot reject slower when re-run")
    payload = fake.webhook_payload("issue_comment", made.number, comment=comment)
    assert deliver(client, "issue_comment", payload)[0] == 200
    assert world.state(made.cycle_id) == "rejected"
    for status_, _, trail in world.findings(made):
        assert status_ == "refuted" and trail[-1] == ("refuted", "grace", "slower when re-run")
    assert fake.pulls[made.number - 1]["state"] == "closed"


def test_rerun_command_starts_one_new_cycle_at_the_same_point(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    made = world.cycle({"width": 64})
    fake.permissions["heidi"] = "write"
    comment = fake.comment_on_github(made.number, "heidi", "/autopilot rerun")
    payload = fake.webhook_payload("issue_comment", made.number, comment=comment)
    before = world.cycles()
    status, answer, delivery = deliver(client, "issue_comment", payload)
    assert status == 200, answer
    assert world.cycles() == before + 1
    shown = client.get("/api/v1/cycles", headers={"Authorization": f"Bearer {world.reader}"}).json()
    new = shown[0]
    assert new["id"] != made.cycle_id and new["state"] == "planned"
    assert (new["experiment"], new["parameters"]) == ("probe", {"width": 64})
    assert "heidi" in new["changed_hypothesis"]
    assert world.state(made.cycle_id) == "awaiting_review"
    deliver(client, "issue_comment", payload, delivery=delivery)
    deliver(client, "issue_comment", payload)  # the same comment, another delivery: one cycle
    assert world.cycles() == before + 1


def test_refused_deliveries_change_nothing(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    made = world.cycle()
    fake.merge_on_github(made.number, by="carol")
    payload = fake.webhook_payload("pull_request", made.number, sender="carol")
    status, answer, delivery = deliver(client, "pull_request", payload, secret="not-the-secret")
    assert status == 401 and answer["type"].endswith("/webhook-signature-invalid")
    assert deliver(client, "pull_request", payload, signature="")[0] == 401
    assert deliver(client, "pull_request", payload, signature="sha1=abc")[0] == 401
    assert SECRET not in str(answer)
    # A commenter without write access.
    other = world.cycle()
    comment = fake.comment_on_github(other.number, "mallory", "/autopilot approve")
    command = fake.webhook_payload("issue_comment", other.number, comment=comment)
    status, answer, refused = deliver(client, "issue_comment", command)
    assert status == 403 and "mallory" in answer["detail"], answer
    # An oversized body: 413 before it is read whole, whatever its signature says.
    huge = client.post(
        "/api/v1/webhooks/github",
        content=b"{" + b" " * MAX_WEBHOOK_BYTES + b"}",
        headers={"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "big"},
    )
    assert huge.status_code == 413
    assert huge.headers["content-type"].startswith("application/problem+json")
    assert world.state(made.cycle_id) == world.state(other.cycle_id) == "awaiting_review"
    assert [s for s, _, _ in world.findings(made)] == ["proposed", "proposed"]
    assert [s for s, _, _ in world.findings(other)] == ["proposed", "proposed"]
    assert writes(fake) == []
    # None of them was recorded as acted on: the genuine delivery of the same ids acts.
    assert deliver(client, "pull_request", payload, delivery=delivery)[0] == 200
    assert world.state(made.cycle_id) == "approved"
    fake.permissions["mallory"] = "write"
    assert deliver(client, "issue_comment", command, delivery=refused)[0] == 200
    assert world.state(other.cycle_id) == "approved"
    assert TOKEN not in str(fake.comments)


def test_other_events_repositories_and_pull_requests_are_acknowledged_and_ignored(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    made = world.cycle()
    assert deliver(client, "ping", {"zen": "Keep it logically awesome."})[0] == 200
    assert deliver(client, "push", {"ref": "refs/heads/main"})[0] == 202
    opened = fake.webhook_payload("pull_request", made.number, action="opened")
    assert deliver(client, "pull_request", opened)[0] == 202
    fake.merge_on_github(made.number, by="carol")
    elsewhere = fake.webhook_payload("pull_request", made.number)
    elsewhere["repository"]["full_name"] = "someone/else"
    assert deliver(client, "pull_request", elsewhere)[0] == 202
    stray = fake.add_pull("feature/by-hand")
    fake.merge_on_github(stray["number"], by="carol")
    stray_payload = fake.webhook_payload("pull_request", stray["number"])
    assert deliver(client, "pull_request", stray_payload)[0] == 202
    chat = fake.comment_on_github(made.number, "carol", "looks good")
    assert (
        deliver(
            client,
            "issue_comment",
            fake.webhook_payload("issue_comment", made.number, comment=chat),
        )[0]
        == 202
    )
    assert world.state(made.cycle_id) == "awaiting_review"


def test_without_a_secret_every_delivery_is_refused(
    gh_settings: Settings, stores: Stores, fake: FakeGitHub
) -> None:
    unset = gh_settings.model_copy(update={"github_webhook_secret": None})
    world = World(unset, stores, fake)
    made = world.cycle()
    fake.merge_on_github(made.number, by="carol")
    with TestClient(create_app(unset, stores)) as client:
        payload = fake.webhook_payload("pull_request", made.number)
        status, answer, _ = deliver(client, "pull_request", payload, secret="")
    assert status == 503 and "AUTOPILOT_GITHUB_WEBHOOK_SECRET" in answer["detail"]
    assert world.state(made.cycle_id) == "awaiting_review"


def test_reconciliation_applies_what_no_webhook_delivered_in_one_run(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    merged, closed, still_open = world.cycle(), world.cycle(), world.cycle()
    fake.merge_on_github(merged.number, by="carol")
    fake.review_on_github(closed.number, "dave", "CHANGES_REQUESTED", "The CI straddles 1")
    fake.close_on_github(closed.number, by="dave")
    done = decisions.reconcile(world.stores, world.settings)
    assert len(done) == 2, done
    assert world.state(merged.cycle_id) == "approved"
    assert [(s, by) for s, by, _ in world.findings(merged)] == [("validated", "carol")] * 2
    assert world.state(closed.cycle_id) == "rejected"
    assert world.findings(closed)[0][2][-1] == ("refuted", "dave", "The CI straddles 1")
    assert world.state(still_open.cycle_id) == "awaiting_review"
    assert writes(fake) == []
    # The next run, and the late webhook, find them decided: nothing twice.
    assert decisions.reconcile(world.stores, world.settings) == []
    payload = fake.webhook_payload("pull_request", merged.number, sender="carol")
    status, answer, _ = deliver(client, "pull_request", payload)
    assert status == 200 and "decided already" in answer["outcome"]
    assert len(world.findings(merged)[0][2]) == 2  # proposed, validated: once


def test_the_beat_runs_the_reconciliation(gh_settings: Settings) -> None:
    from app.broker import celery_config
    from workers import celery_app, tasks

    schedule = celery_app.beat_schedule(celery_config(gh_settings), gh_settings)
    entry = schedule["reconcile-github"]
    assert entry["task"] == tasks.reconcile_github.name
    assert entry["schedule"] == gh_settings.github_reconcile_interval_s


@pytest.mark.parametrize(
    ("verdict", "state"),
    [
        ("faster", "success"),
        ("inconclusive", "success"),
        ("slower", "failure"),
        ("rejected_accuracy", "failure"),
    ],
)
def test_the_verdict_shows_as_a_commit_status_on_the_head(
    gh_settings: Settings, stores: Stores, fake: FakeGitHub, verdict: str, state: str
) -> None:
    from app.forge import service as forge_service
    from app.forge.base import ProjectRef

    pr = fake.add_pull("autopilot/spectral/1-probe")
    forge = forge_service.forge_for(gh_settings, stores)
    project = ProjectRef("spectral", "https://github.example/lab/research.git")
    page = "https://autopilot.lab/dashboard/cycles/1"
    sha = pr["head"]["sha"]
    assert forge_service.show_verdict(
        forge, project, sha, verdict, f"{verdict}: ratio 0.8 [0.75, 0.86]", page
    )
    (status,) = fake.statuses[sha]
    assert status["state"] == state and status["target_url"] == page
    assert status["description"] == f"{verdict}: ratio 0.8 [0.75, 0.86]"
    assert status["context"] == "autopilot/verdict"
    # A forge that refuses: the PR stands, the status is only logged as missing.
    fake.faults[("POST", "/statuses/{n}")].append(Fault(422, {"message": "Validation Failed"}))
    assert not forge_service.show_verdict(forge, project, sha, verdict, "x", page)
    assert len(fake.statuses[sha]) == 1


def test_the_webhook_of_a_dashboard_rejection_finds_it_decided(
    world: World, client: TestClient, fake: FakeGitHub
) -> None:
    """The dashboard's reject closes the PR on GitHub, whose webhook for that close comes back
    while the rejection is still being recorded: one decision, the reviewer's, and no error."""
    from app.cycles import review

    made = world.cycle()
    answers: list[tuple[int, dict[str, object], str]] = []
    read_the_note = threading.Event()

    def github_sends_the_close() -> None:
        # The close's answer is held until the delivery has read the PR's reviews: it is then
        # about to decide, while the dashboard's rejection is not recorded yet.
        payload = fake.webhook_payload("pull_request", made.number, sender=fake.bot)
        sender = threading.Thread(
            target=lambda: answers.append(deliver(client, "pull_request", payload))
        )
        sender.start()
        threads.append(sender)
        assert read_the_note.wait(30)

    threads: list[threading.Thread] = []
    fake.after[("PATCH", "/pulls/{n}")] = github_sends_the_close
    fake.after[("GET", "/pulls/{n}/reviews")] = read_the_note.set
    review.review(
        world.stores,
        world.settings,
        made.cycle_id,
        approve=False,
        note="The CI straddles 1",
        actor="alice",
    )
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers) == 1 and answers[0][0] == 200, answers
    assert "decided already" in str(answers[0][1]["outcome"])
    assert world.state(made.cycle_id) == "rejected"
    (step,) = world.steps(made.cycle_id)
    assert step == ("review", "rejected by alice: The CI straddles 1")
    for _, _, trail in world.findings(made):
        assert trail[1:] == [("refuted", "alice", "The CI straddles 1")]
