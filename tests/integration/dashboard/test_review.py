"""The review path over HTML: the queue, the PR page with its evidence, and the decision form."""

from __future__ import annotations

import copy
import re
import subprocess

from fastapi.testclient import TestClient

from app.cycles.models import Cycle
from app.cycles.pull_request import links, pr_body, pr_title
from app.db import Stores
from app.forge.local import LocalForge
from app.memory import service as memory
from app.memory.schemas import FindingCreate
from app.settings import Settings
from tests.integration.dashboard.conftest import CycleFactory, login, stopped_command_result
from tests.integration.forge.pr_cycles import harness_cycle

EVIL = '<script>alert("x")</script><b>bold</b>'


def _state(stores: Stores, cycle_id: int) -> str:
    with stores.ops_session() as session:
        cycle = session.get(Cycle, cycle_id)
        assert cycle is not None
        return cycle.state


def _statuses(stores: Stores, ids: list[str]) -> list[str]:
    with stores.memory_session() as session:
        return [memory.get(session, fid).status for fid in ids]


def test_empty_queue_says_what_to_do_next(client: TestClient, tokens: dict[str, str]) -> None:
    login(client, tokens["reader"])
    page = client.get("/dashboard/")
    assert page.status_code == 200
    assert "Nothing awaits review" in page.text
    assert "autopilot project create" in page.text and "/api/v1/cycles" in page.text
    assert "No decisions yet" in page.text


def test_queue_lists_awaiting_first_with_badges_then_decisions_and_filters(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory
) -> None:
    waiting = cycles.make(hypothesis=EVIL)
    slower = cycles.make(verdict="slower", hypothesis="Unrolling helps")
    decided = cycles.make(state="approved", hypothesis="Already decided one")
    login(client, tokens["reader"])
    page = client.get("/dashboard/").text
    awaiting, _, recent = page.partition("Recent decisions")
    assert f'/dashboard/cycles/{waiting.cycle_id}"' in awaiting
    assert f'/dashboard/cycles/{slower.cycle_id}"' in awaiting
    assert f'/dashboard/cycles/{decided.cycle_id}"' in recent
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page
    assert "0.800 [0.750, 0.860]" in page and "cpu-test" in page and "pass" in page
    assert 'class="badge v-faster"' in awaiting and 'class="badge v-slower"' in awaiting
    assert "1 unverified" in awaiting  # the proposed finding awaits the decision
    assert "probe-dash" in page
    only_slower = client.get("/dashboard/", params={"verdict": "slower"}).text
    assert f'/dashboard/cycles/{slower.cycle_id}"' in only_slower
    assert f'/dashboard/cycles/{waiting.cycle_id}"' not in only_slower
    only_approved = client.get("/dashboard/", params={"state": "approved"}).text
    assert f'/dashboard/cycles/{decided.cycle_id}"' in only_approved
    assert f'/dashboard/cycles/{waiting.cycle_id}"' not in only_approved
    unknown = client.get("/dashboard/", params={"project": "nope"})
    assert unknown.status_code == 404 and "nope" in unknown.text


def test_a_command_experiments_better_and_worse_are_badged_and_filtered(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory
) -> None:
    better = cycles.make(verdict="better", hypothesis="Wider layers lower the loss")
    worse = cycles.make(verdict="worse", hypothesis="Dropout raises the loss")
    login(client, tokens["reader"])
    page = client.get("/dashboard/").text
    assert 'class="badge v-better"' in page and 'class="badge v-worse"' in page
    assert '<option value="better"' in page and '<option value="worse"' in page
    only_better = client.get("/dashboard/", params={"verdict": "better"}).text
    assert f'/dashboard/cycles/{better.cycle_id}"' in only_better
    assert f'/dashboard/cycles/{worse.cycle_id}"' not in only_better
    css = client.get("/dashboard/static/dashboard.css").text
    good = css.split(".v-faster", 1)[1].split("}", 1)[0]
    bad = css.split(".v-slower", 1)[1].split("}", 1)[0]
    assert ".v-better" in good and ".v-worse" in bad


def test_pr_page_shows_each_fact_once_and_the_whole_report_on_its_own_page(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory, stores: Stores
) -> None:
    made = cycles.make(hypothesis=EVIL)
    with stores.memory_session() as session:
        known = memory.create(
            session,
            FindingCreate(
                project="probe-dash", kind="lesson", statement="probe timings vary below 1 ms"
            ),
            "seed",
        )
        memory.validate(session, known.id, "seed")
    login(client, tokens["review"])
    response = client.get(f"/dashboard/cycles/{made.cycle_id}")
    assert response.status_code == 200
    page = response.text
    assert "script-src 'self'" in response.headers["content-security-policy"]
    # The hypothesis is text, and on the page once: the report is a click away, and the diff
    # leaves out the report's files.
    assert "<script>alert" not in page and "<b>bold</b>" not in page
    assert page.count("&lt;script&gt;alert") == 1
    assert "PR #1" in page and "probe: fused loop" in page
    assert page.count("<table>") == 1 and "<td>candidate</td>" in page  # the results table
    assert page.count(f'src="/dashboard/cycles/{made.cycle_id}/plot.svg"') == 1
    assert "0.800 [0.750, 0.860]" in page and "95% bootstrap interval" in page
    assert "Accuracy gate: not reported by the experiment." in page
    diff = page[page.index('<pre class="diff">') : page.index("</pre>", page.index("diff"))]
    assert f"results/{made.cycle_id}/REPORT.md, results/{made.cycle_id}/plot.svg" in diff
    assert "left out of the diff" in diff and "+# " not in diff
    assert "device_name" in page and "2.13.0" in page  # environment
    assert "probe finished" in page  # job log tail
    assert "probe timings vary below 1 ms" in page  # related finding from memory
    assert re.search(r"<fieldset>\s*<legend>", page)  # the form is enabled for a reviewer
    assert 'value="approve"' in page and 'value="reject"' in page and 'name="merge"' in page
    assert f'href="/dashboard/cycles/{made.cycle_id}/report"' in page

    whole = client.get(f"/dashboard/cycles/{made.cycle_id}/report")
    assert whole.status_code == 200
    report = whole.text
    assert "<h2>Results</h2>" in report and "<h2>Hypothesis</h2>" in report  # REPORT.md
    assert "<script>alert" not in report and "&lt;script&gt;alert" in report
    assert f'src="/dashboard/cycles/{made.cycle_id}/plot.svg"' in report
    assert "script-src 'self'" in whole.headers["content-security-policy"]
    assert client.get("/dashboard/cycles/4242/report").status_code == 404


def test_pr_page_says_where_each_number_came_from_and_where_the_blocks_stopped(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory
) -> None:
    """A sequential command comparison: the runner's clock and the base commit's evaluator,
    stopped after 3 of at most 12 blocks, the GPU time of the 9 not run saved; and a
    self-reported one, flagged as the candidate's own word."""
    result = stopped_command_result()
    made = cycles.make(result=result, hypothesis="Wider layers train faster")
    reported = copy.deepcopy(result)
    reported["integrity"].update(metric_source="output", self_reported=True, trusted=False)
    reported["integrity"]["flags"] = ["self-reported: `run_s` was read from the output of code"]
    reported["trusted"] = reported["headline"]["trusted"] = False
    own_word = cycles.make(result=reported, hypothesis="Printing helps")
    login(client, tokens["review"])
    page = client.get(f"/dashboard/cycles/{made.cycle_id}").text
    sources = page[page.index('id="sources"') : page.index("</ul>", page.index('id="sources"'))]
    assert '<code>run_s</code>: <span class="badge trusted">runner clock</span>' in sources
    assert "check <code>val_loss</code>: " in sources
    assert '<span class="badge trusted">evaluator at the base commit</span>' in sources
    assert "untrusted" not in page and 'id="flags"' not in page
    # The stop line is the report's own, GPU time saved included: 9 blocks x 3 runs x the
    # median run's time.
    durations = sorted(run["duration_s"] for run in result["runs"])
    saved = 3 * 9 * durations[len(durations) // 2]
    stop = page[page.index('id="stop">') : page.index("</dd>", page.index('id="stop">'))]
    assert "Blocks: 3 of at most 12, decided: the difference crossed" in stop
    assert f"9 blocks not run saved about {saved:.3g} GPU s." in stop
    assert "the stopping rule&#39;s repeated 95% interval" in page
    assert "Check gate <code>val_loss</code>" in page and "<strong>pass</strong>" in page
    assert page.count("<table>") == 1 and "<td>baseline A/A</td>" in page  # the arms, once

    flagged = client.get(f"/dashboard/cycles/{own_word.cycle_id}").text
    assert "self-reported: not a trusted win" in flagged
    assert '<span class="badge untrusted">self-reported</span>' in flagged
    assert 'id="flags"' in flagged and "read from the output of code" in flagged


def test_plot_is_served_as_svg_with_a_restrictive_policy(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory
) -> None:
    from_bare = cycles.make()
    from_worktree = cycles.make(with_pr=False, keep_worktree=True)
    login(client, tokens["reader"])
    for made in (from_bare, from_worktree):
        plot = client.get(f"/dashboard/cycles/{made.cycle_id}/plot.svg")
        assert plot.status_code == 200
        assert plot.headers["content-type"] == "image/svg+xml"
        assert "default-src 'none'" in plot.headers["content-security-policy"]
        assert "sandbox" in plot.headers["content-security-policy"]
        assert plot.headers["x-content-type-options"] == "nosniff"
        assert plot.text.startswith("<svg")
        assert "forged" not in plot.text  # the commit's plot, not the directory's
    assert client.get("/dashboard/cycles/999/plot.svg").status_code == 404
    no_pr = client.get(f"/dashboard/cycles/{from_worktree.cycle_id}").text
    assert "not opened yet" in no_pr and "No pull request yet, so no diff" in no_pr
    report = client.get(f"/dashboard/cycles/{from_worktree.cycle_id}/report").text
    assert "<h2>Results</h2>" in report
    assert "Forged" not in report and "written after the commit" not in report


def test_approve_validates_findings_and_posts_the_note(
    client: TestClient,
    tokens: dict[str, str],
    cycles: CycleFactory,
    stores: Stores,
    settings: Settings,
) -> None:
    made = cycles.make()
    csrf = login(client, tokens["review"])
    url = f"/dashboard/cycles/{made.cycle_id}/review"
    missing = client.post(url, data={"decision": "approve", "note": "ok"})
    assert missing.status_code == 403 and "Form expired" in missing.text
    forged = client.post(url, data={"decision": "approve", "note": "ok", "csrf_token": "x" * 32})
    assert forged.status_code == 403
    foreign = client.post(
        url,
        headers={"Origin": "http://evil.example"},
        data={"decision": "approve", "note": "ok", "csrf_token": csrf},
    )
    assert foreign.status_code == 403
    assert _state(stores, made.cycle_id) == "awaiting_review"
    assert _statuses(stores, made.finding_ids) == ["proposed"]

    done = client.post(
        url,
        data={"decision": "approve", "note": "numbers hold <i>up</i>", "csrf_token": csrf},
        follow_redirects=False,
    )
    assert done.status_code == 303
    assert done.headers["location"] == f"/dashboard/cycles/{made.cycle_id}?done=approved"
    assert _state(stores, made.cycle_id) == "approved"
    assert _statuses(stores, made.finding_ids) == ["validated"]
    comments = LocalForge(settings, stores).comments(made.project, 1)
    assert any("numbers hold <i>up</i>" in c and "alice" in c for c in comments)
    page = client.get(done.headers["location"]).text
    assert "Decision recorded: approved" in page
    assert 'name="decision"' not in page  # decided: no form any more
    assert "numbers hold &lt;i&gt;up&lt;/i&gt;" in page  # the PR comment, escaped
    again = client.post(url, data={"decision": "reject", "note": "no", "csrf_token": csrf})
    assert again.status_code == 409 and "only a cycle awaiting review" in again.text


def test_reject_needs_a_note_then_refutes_with_it_and_closes_the_pr(
    client: TestClient,
    tokens: dict[str, str],
    cycles: CycleFactory,
    stores: Stores,
    settings: Settings,
) -> None:
    made = cycles.make()
    csrf = login(client, tokens["admin"])
    url = f"/dashboard/cycles/{made.cycle_id}/review"
    blank = client.post(url, data={"decision": "reject", "note": "  ", "csrf_token": csrf})
    assert blank.status_code == 422 and "a rejection needs a note" in blank.text
    assert _state(stores, made.cycle_id) == "awaiting_review"
    odd = client.post(url, data={"decision": "maybe", "csrf_token": csrf})
    assert odd.status_code == 422
    note = "noise floor too high <img src=x onerror=alert(1)>"
    done = client.post(url, data={"decision": "reject", "note": note, "csrf_token": csrf})
    assert done.status_code == 200 and "Decision recorded: rejected" in done.text
    assert _state(stores, made.cycle_id) == "rejected"
    assert _statuses(stores, made.finding_ids) == ["refuted"]
    assert LocalForge(settings, stores).get_pull_request(made.project, 1).state == "closed"
    finding = client.get(f"/dashboard/memory/{made.finding_ids[0]}").text
    assert "noise floor too high &lt;img src=x onerror=alert(1)&gt;" in finding
    assert "<img src=x" not in finding


def test_read_only_token_sees_the_form_disabled_and_a_post_is_refused(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory, stores: Stores
) -> None:
    made = cycles.make()
    csrf = login(client, tokens["reader"])
    page = client.get(f"/dashboard/cycles/{made.cycle_id}").text
    assert "<fieldset disabled>" in page and "can read but not decide" in page
    refused = client.post(
        f"/dashboard/cycles/{made.cycle_id}/review",
        data={"decision": "approve", "csrf_token": csrf},
    )
    assert refused.status_code == 403 and "scope" in refused.text
    assert _state(stores, made.cycle_id) == "awaiting_review"
    assert _statuses(stores, made.finding_ids) == ["proposed"]


def test_approve_with_merge_rings_the_merge(
    client: TestClient,
    tokens: dict[str, str],
    cycles: CycleFactory,
    stores: Stores,
    monkeypatch: object,
) -> None:
    from app import broker

    rung: list[int] = []
    monkeypatch.setattr(broker, "ring_merge", lambda _s, cycle_id: rung.append(cycle_id))  # type: ignore[attr-defined]
    made = cycles.make()
    plain = cycles.make()
    csrf = login(client, tokens["review"])
    client.post(
        f"/dashboard/cycles/{plain.cycle_id}/review",
        data={"decision": "approve", "csrf_token": csrf},
    )
    client.post(
        f"/dashboard/cycles/{made.cycle_id}/review",
        data={"decision": "approve", "merge": "1", "csrf_token": csrf},
    )
    assert rung == [made.cycle_id]


def test_unknown_cycle_is_a_404_page(client: TestClient, tokens: dict[str, str]) -> None:
    login(client, tokens["reader"])
    page = client.get("/dashboard/cycles/4242")
    assert page.status_code == 404 and "no cycle 4242" in page.text
    assert page.headers["content-type"].startswith("text/html")


def test_local_pr_page_shows_the_pull_request_body_as_github_would(
    client: TestClient,
    tokens: dict[str, str],
    cycles: CycleFactory,
    stores: Stores,
    settings: Settings,
) -> None:
    """The body Publish writes, on the local forge's report page (the review page shows each of
    its facts once): verdict, gate, table, the plot (from the dashboard's own route), reproduce
    line and links; nothing of it as raw HTML."""
    made = cycles.make(with_pr=False, hypothesis=EVIL)
    with stores.ops_session() as session:
        cycle = session.get(Cycle, made.cycle_id)
        assert cycle is not None and cycle.branch
        session.expunge(cycle)
    forge = LocalForge(settings, stores)
    _, result = harness_cycle()
    where = links(cycle, made.project, forge, settings.dashboard_base_url)
    assert where.plot == f"{settings.dashboard_base_url}/cycles/{made.cycle_id}/plot.svg"
    subprocess.run(
        ["git", "-C", str(made.repo), "push", "-q", forge.remote_url(made.project), cycle.branch],
        check=True,
    )
    pr = forge.open_pull_request(
        made.project,
        cycle.branch,
        "main",
        pr_title(cycle),
        pr_body(cycle, made.project, result, where),
    )
    with stores.ops_session() as session:
        row = session.get(Cycle, made.cycle_id)
        assert row is not None
        row.pr_number, row.pr_url = pr.number, pr.url
    login(client, tokens["review"])
    assert 'id="pr-body-h"' not in client.get(f"/dashboard/cycles/{made.cycle_id}").text
    page = client.get(f"/dashboard/cycles/{made.cycle_id}/report").text
    start = page.index('<h2 id="pr-body-h">')
    shown = page[start : page.index("</section>", start)]
    assert "<strong>Verdict: faster</strong>, ratio 0.800 [0.750, 0.860]" in shown
    assert "Accuracy gate: <strong>pass</strong>" in shown
    assert "<table>" in shown and "<td>fused</td>" in shown
    assert f'<img src="/dashboard/cycles/{made.cycle_id}/plot.svg" alt="paired samples"' in shown
    assert "autopilot job submit --project probe-dash --experiment probe" in shown
    assert f'href="{where.dashboard}"' in shown and f'href="{where.findings}"' in shown
    assert "<script>alert" not in shown and "&lt;script&gt;alert" in shown
