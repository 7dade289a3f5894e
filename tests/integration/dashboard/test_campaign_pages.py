"""Research campaigns over HTML: the list with its filters, a campaign's page (its line, each
step with its outcome, reason, ratio and why, the cumulative result, the pull request), and the
form that stops it. A campaign here is built in the DB as its driver leaves it (no workers)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.cycles.campaigns import service as campaigns
from app.cycles.campaigns.models import Campaign, CampaignStep
from app.cycles.campaigns.schemas import CampaignCreate
from app.cycles.models import Cycle
from app.dashboard import live
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.dashboard.conftest import CycleFactory, login

EVIL = '<script>alert("x")</script><b>bold</b>'
START, TIP = "5" * 40, "7" * 40


@dataclass
class Line:
    campaign_id: int
    kept: int  # the kept step's cycle
    confirmation: int  # the cycle that confirmed it
    discarded: int
    judging: int  # a step of the next round, not decided yet
    final: int | None  # the measurement of the tip against the start, once ended


def build_campaign(
    stores: Stores, project: str = "line-probe", *, ended: bool = False, hypothesis: str = EVIL
) -> Line:
    """A campaign in its second round: one step kept (confirmed), one discarded with its
    reason, one being judged; `ended`: finished, with its cumulative result and pull request."""
    with stores.ops_session() as session:
        if project not in ops.project_names(session).values():
            ops.create_project(session, ProjectCreate(name=project, repo_url=f"/srv/{project}"))
        campaign = campaigns.create(
            session, CampaignCreate(project=project, max_cycles=6, parallel=2), "alice"
        )

        def cycle(state: str, says: str | None, role: str = "step") -> int:
            row = Cycle(
                project_id=campaign.project_id,
                state=state,
                hypothesis=says,
                campaign_id=campaign.id,
                role=role,
            )
            session.add(row)
            session.flush()
            return row.id

        kept = cycle("judged", "Fusing the loop halves the time")
        confirmation = cycle("judged", None, "confirmation")
        discarded = cycle("judged", hypothesis)
        judging = cycle("cancelled" if ended else "running", "Unrolling by four helps")
        session.add_all(
            [
                CampaignStep(
                    campaign_id=campaign.id,
                    cycle_id=kept,
                    round=1,
                    tip_sha=START,
                    confirmation_cycle_id=confirmation,
                    outcome="kept",
                    sentence="Kept: a trusted win, confirmed on fresh blocks.",
                    ratio=0.81,
                    ci_low=0.78,
                    ci_high=0.84,
                    kept_sha=TIP,
                ),
                CampaignStep(
                    campaign_id=campaign.id,
                    cycle_id=discarded,
                    round=1,
                    tip_sha=START,
                    outcome="discarded",
                    reason="self_reported",
                    sentence="Discarded (self reported): the number came from <i>the candidate</i>.",
                    ratio=0.5,
                    ci_low=0.45,
                    ci_high=0.55,
                ),
                CampaignStep(campaign_id=campaign.id, cycle_id=judging, round=2, tip_sha=TIP),
            ]
        )
        campaign.line_branch = f"autopilot/{project}/line-{campaign.id}"
        campaign.start_sha, campaign.tip_sha, campaign.round = START, TIP, 2
        final = None
        if ended:
            final = cycle("judged", None, "final")
            campaign.state = "finished"
            campaign.end_reason = "ran its 6 steps"
            campaign.final_cycle_id = final
            campaign.cumulative = {
                "ratio": 0.8,
                "ci_low": 0.77,
                "ci_high": 0.83,
                "verdict": "faster",
                "cycle_id": final,
            }
            campaign.pr_number = 7
            campaign.pr_url = f"local://{project}/pulls/7"
        session.flush()
        return Line(campaign.id, kept, confirmation, discarded, judging, final)


def stored(stores: Stores, campaign_id: int) -> Campaign:
    with stores.ops_session() as session:
        campaign = campaigns.get(session, campaign_id)
        session.expunge(campaign)
    return campaign


def doorbells(settings: Settings) -> list[tuple[str, str]]:
    """(task, its arguments) of each message waiting on the control queue."""
    found = []
    for path in sorted((settings.broker_dir / "queue").glob("*.control.msg")):
        headers = json.loads(path.read_text())["headers"]
        found.append((headers["task"], headers["argsrepr"]))
    return found


def test_a_campaign_page_shows_its_line_steps_cumulative_result_and_pull_request(
    client: TestClient, tokens: dict[str, str], stores: Stores
) -> None:
    line = build_campaign(stores, ended=True)
    login(client, tokens["reader"])
    response = client.get(f"/dashboard/campaigns/{line.campaign_id}")
    assert response.status_code == 200
    page = response.text
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert f"autopilot/line-probe/line-{line.campaign_id}" in page
    assert f'title="{START}">{START[:12]}</code>' in page
    assert f'title="{TIP}">{TIP[:12]}</code>' in page
    assert 'class="badge s-finished"' in page and "ran its 6 steps" in page
    steps = page[page.index('id="steps"') :]
    # each step: its cycle, outcome, reason, ratio [CI] and why, in the order they started
    order = [steps.index(f'data-cycle="{c}"') for c in (line.kept, line.discarded, line.judging)]
    assert order == sorted(order)
    kept = steps[order[0] : order[1]]
    assert 'class="badge o-kept"' in kept and "0.810 [0.780, 0.840]" in kept
    assert f'href="/dashboard/cycles/{line.confirmation}"' in kept
    assert f'title="{TIP}"' in kept and "confirmed on fresh blocks" in kept
    dropped = steps[order[1] : order[2]]
    assert 'class="badge o-discarded"' in dropped and "<code>self_reported</code>" in dropped
    assert "0.500 [0.450, 0.550]" in dropped
    assert "&lt;i&gt;the candidate&lt;/i&gt;" in dropped  # the why, as text
    # every text escaped: the hypothesis is the step's cycle's, shown as text
    assert "<script>alert" not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;alert" in dropped
    assert 'class="badge s-cancelled"' in steps[order[2] :]
    cumulative = page[page.index('id="cumulative"') : page.index('id="steps"')]
    assert "0.800 [0.770, 0.830]" in cumulative and 'class="badge v-faster"' in cumulative
    assert f'href="/dashboard/cycles/{line.final}"' in cumulative
    assert "local://line-probe/pulls/7" in cumulative
    # an ended campaign: nothing to stop, nothing live
    assert "/stop" not in page and "data-live-url" not in page


def test_a_running_campaign_is_live_and_a_trigger_token_stops_it(
    client: TestClient, tokens: dict[str, str], stores: Stores, settings: Settings
) -> None:
    line = build_campaign(stores)
    csrf = login(client, tokens["reader"])  # bob: scope trigger
    page = client.get(f"/dashboard/campaigns/{line.campaign_id}").text
    assert 'data-live-url="/dashboard/live/cycles"' in page
    assert f'action="/dashboard/campaigns/{line.campaign_id}/stop"' in page
    assert "not measured yet" in page.lower() and "not opened yet" in page
    judging = page[page.index(f'data-cycle="{line.judging}"') :]
    assert "being judged" in judging.split("</tr>")[0]
    assert doorbells(settings) == []

    done = client.post(
        f"/dashboard/campaigns/{line.campaign_id}/stop",
        data={"csrf_token": csrf},
        follow_redirects=False,
    )
    assert done.status_code == 303, done.text
    assert done.headers["location"] == f"/dashboard/campaigns/{line.campaign_id}?done=stopped"
    campaign = stored(stores, line.campaign_id)
    assert campaign.stop_requested and campaign.end_reason == "stopped by bob"
    # after the commit, the driver's doorbell names the campaign
    assert doorbells(settings) == [("autopilot.advance_campaign", f"[{line.campaign_id}]")]
    after = client.get(done.headers["location"]).text
    assert "Stop requested: no new step starts" in after
    assert f'action="/dashboard/campaigns/{line.campaign_id}/stop"' not in after


def test_stopping_is_refused_without_the_scope_a_fresh_form_or_a_live_campaign(
    app: FastAPI, client: TestClient, tokens: dict[str, str], stores: Stores, settings: Settings
) -> None:
    line = build_campaign(stores)
    ended = build_campaign(stores, ended=True)
    path = f"/dashboard/campaigns/{line.campaign_id}/stop"
    assert client.post(path, data={"csrf_token": "x"}).status_code == 401

    with TestClient(app) as reviewer:
        csrf = login(reviewer, tokens["review"])  # alice: scope review only
        page = reviewer.get(f"/dashboard/campaigns/{line.campaign_id}").text
        assert "<fieldset disabled>" in page
        assert "stopping needs scope <code>trigger</code>" in page
        refused = reviewer.post(path, data={"csrf_token": csrf})
        assert refused.status_code == 403 and "needs a token with scope" in refused.text

    csrf = login(client, tokens["reader"])
    expired = client.post(path, data={"csrf_token": "not-the-session's"})
    assert expired.status_code == 403 and "Form expired" in expired.text
    elsewhere = client.post(
        path, data={"csrf_token": csrf}, headers={"origin": "https://evil.example"}
    )
    assert elsewhere.status_code == 403
    assert not stored(stores, line.campaign_id).stop_requested

    over = client.post(f"/dashboard/campaigns/{ended.campaign_id}/stop", data={"csrf_token": csrf})
    assert over.status_code == 409 and "has already ended (finished)" in over.text
    assert not stored(stores, ended.campaign_id).stop_requested
    missing = client.post("/dashboard/campaigns/999/stop", data={"csrf_token": csrf})
    assert missing.status_code == 404 and "no campaign 999" in missing.text
    assert doorbells(settings) == []


def test_the_campaign_list_links_each_campaign_and_filters(
    client: TestClient, tokens: dict[str, str], stores: Stores, cycles: CycleFactory
) -> None:
    login(client, tokens["reader"])
    empty = client.get("/dashboard/campaigns").text
    assert "No campaigns" in empty and "autopilot campaign start" in empty
    cycles.project("probe-dash")  # a project with its repository, for its own page
    running = build_campaign(stores, "probe-dash", hypothesis="Tiling helps")
    ended = build_campaign(stores, ended=True)
    page = client.get("/dashboard/campaigns").text
    assert '<a href="/dashboard/campaigns" aria-current="page">Campaigns</a>' in page
    rows = page[page.index('id="campaigns"') :]
    # newest first, each with its project, state, steps, kept and cumulative figures
    assert rows.index(f'data-campaign="{ended.campaign_id}"') < rows.index(
        f'data-campaign="{running.campaign_id}"'
    )
    assert f'href="/dashboard/campaigns/{running.campaign_id}"' in rows
    assert 'href="/dashboard/projects/probe-dash"' in rows
    assert "3 / 6" in rows and "0.800 [0.770, 0.830]" in rows and "#7" in rows
    assert 'data-live-url="/dashboard/live/cycles"' in page  # one of them is running

    only = client.get("/dashboard/campaigns", params={"project": "probe-dash"}).text
    assert f'data-campaign="{running.campaign_id}"' in only
    assert f'data-campaign="{ended.campaign_id}"' not in only
    finished = client.get("/dashboard/campaigns", params={"state": "finished"}).text
    assert f'data-campaign="{ended.campaign_id}"' in finished
    assert f'data-campaign="{running.campaign_id}"' not in finished
    none = client.get("/dashboard/campaigns", params={"state": "failed"}).text
    assert "No campaigns match these filters" in none
    unknown = client.get("/dashboard/campaigns", params={"project": "nope"})
    assert unknown.status_code == 404 and "no project named &#39;nope&#39;" in unknown.text

    # the project's page leads to its campaigns
    project = client.get("/dashboard/projects/probe-dash")
    assert project.status_code == 200
    assert 'href="/dashboard/campaigns?project=probe-dash"' in project.text


def test_a_campaign_that_moves_makes_its_pages_stale(stores: Stores) -> None:
    """The driver's last move (the pull request opened, the campaign finished) changes no
    cycle: the live version follows the campaign itself."""
    line = build_campaign(stores)
    before = live.version(stores, "cycles")
    with stores.ops_session() as session:
        campaign = campaigns.get(session, line.campaign_id)
        campaign.state = "finished"
    assert live.version(stores, "cycles") != before


def test_an_unknown_campaign_is_a_404_page_and_pages_need_sign_in(
    client: TestClient, tokens: dict[str, str]
) -> None:
    gone = client.get("/dashboard/campaigns/1", follow_redirects=False)
    assert gone.status_code == 303 and gone.headers["location"].startswith("/dashboard/login")
    assert client.get("/dashboard/campaigns", follow_redirects=False).status_code == 303
    login(client, tokens["reader"])
    missing = client.get("/dashboard/campaigns/999")
    assert missing.status_code == 404
    assert "Campaign not found" in missing.text and "no campaign 999" in missing.text
    # an id beyond the 32-bit columns names nothing: a 404 page, not a 500
    assert client.get(f"/dashboard/campaigns/{2**63}").status_code == 404
