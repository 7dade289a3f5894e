"""GitHubForge through PyGithub against a local server that speaks GitHub's REST API."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from github import Auth
from pydantic import SecretStr

from app.cycles.models import Cycle
from app.cycles.pull_request import links, pr_body, pr_title
from app.errors import InvalidInput
from app.forge.base import ProjectRef
from app.forge.exceptions import ForgeUnavailable, HeadMoved, PullRequestNotOpen
from app.forge.github import GitHubForge, github_repo
from app.git.exceptions import MergeConflict
from tests.integration.forge.github_fake import FakeGitHub, Fault, serve
from tests.integration.forge.pr_cycles import COMMIT, DASHBOARD, command_cycle, harness_cycle

TOKEN = "ghp_TESTtokenThatMustNeverAppear0123456789"
PROJECT = ProjectRef("spectral", "https://github.example/lab/research.git", "main")
HEAD = "autopilot/spectral/c0ffee01-fuse"


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    with serve() as server:
        yield server


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def forge(fake: FakeGitHub, sleeps: list[float]) -> GitHubForge:
    return GitHubForge(
        auth=Auth.Token(TOKEN),
        secret=SecretStr(TOKEN),
        base_url=fake.base_url,
        backoff_s=0.01,
        secondary_rate_wait_s=0.01,
        seconds_between_requests=None,
        seconds_between_writes=None,
        per_page=2,
        sleep=sleeps.append,
    )


def creates(fake: FakeGitHub) -> int:
    return fake.requests.count(("POST", "/pulls"))


def test_open_is_idempotent(fake: FakeGitHub, forge: GitHubForge) -> None:
    first = forge.open_pull_request(PROJECT, HEAD, "main", "Fuse", "body")
    second = forge.open_pull_request(PROJECT, HEAD, "main", "Fuse", "body")
    assert first == second and first.number == 1 and first.state == "open"
    assert first.head == HEAD and first.base == "main" and first.title == "Fuse"
    assert creates(fake) == 1 and len(fake.pulls) == 1
    assert all(h == f"token {TOKEN}" for h in fake.auth_headers)


def test_lookup_follows_pagination(fake: FakeGitHub, forge: GitHubForge) -> None:
    for base in ("release-1", "release-2", "release-3", "main"):
        fake.add_pull(HEAD, base)
    pr = forge.open_pull_request(PROJECT, HEAD, "main", "t", "")
    assert pr.number == 4 and pr.base == "main"  # on page 2 of 2 (per_page=2)
    assert creates(fake) == 0
    assert fake.requests.count(("GET", "/pulls")) == 2


def test_422_already_exists_returns_the_existing_pr(fake: FakeGitHub, forge: GitHubForge) -> None:
    existing = fake.add_pull(HEAD, "main")
    fake.hide_from_list = 1  # the first lookup lags behind; the create answers 422
    pr = forge.open_pull_request(PROJECT, HEAD, "main", "t", "")
    assert pr.number == existing["number"]
    assert creates(fake) == 1 and len(fake.pulls) == 1


def test_secondary_rate_limit_waits_for_retry_after(fake: FakeGitHub, forge: GitHubForge) -> None:
    fake.faults[("POST", "/pulls")].append(
        Fault(
            403,
            {
                "message": "You have exceeded a secondary rate limit. Please wait a few minutes before "
                "you try again.",
                "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
            },
            {"Retry-After": "1"},
        )
    )
    pr = forge.open_pull_request(PROJECT, HEAD, "main", "t", "")
    assert pr.number == 1 and creates(fake) == 2 and len(fake.pulls) == 1


def test_5xx_after_the_create_landed_makes_no_duplicate(
    fake: FakeGitHub, forge: GitHubForge, sleeps: list[float]
) -> None:
    fake.faults[("POST", "/pulls")].append(
        Fault(502, {"message": "Server Error"}, apply_first=True)
    )
    pr = forge.open_pull_request(PROJECT, HEAD, "main", "t", "")
    assert pr.number == 1 and len(fake.pulls) == 1 and creates(fake) == 1
    assert sleeps == [0.01]


def test_persistent_5xx_is_a_clear_unavailable(
    fake: FakeGitHub, forge: GitHubForge, sleeps: list[float]
) -> None:
    fake.faults[("POST", "/pulls")].extend(
        Fault(500, {"message": "Server Error"}) for _ in range(10)
    )
    with pytest.raises(ForgeUnavailable, match="500") as caught:
        forge.open_pull_request(PROJECT, HEAD, "main", "t", "")
    assert caught.value.status == 503
    assert sleeps == [0.01, 0.02, 0.04]
    assert len(fake.pulls) == 0


def test_comment_merge_close(fake: FakeGitHub, forge: GitHubForge) -> None:
    pr = forge.open_pull_request(PROJECT, HEAD, "main", "t", "")
    fake.faults[("POST", "/issues/{n}/comments")].append(
        Fault(500, {"message": "Server Error"}, apply_first=True)
    )
    forge.comment(PROJECT, pr.number, "verdict holds")
    (comment,) = fake.comments[pr.number]  # the retry saw the lost comment: no duplicate
    assert comment["body"].startswith("verdict holds")
    with pytest.raises(HeadMoved):
        forge.merge(PROJECT, pr.number, expected_head_sha="f" * 40)
    merged = forge.merge(PROJECT, pr.number, expected_head_sha=pr.head_sha)
    assert merged.state == "merged" and merged.merge_sha == "m" * 40
    assert forge.merge(PROJECT, pr.number) == merged
    other = forge.open_pull_request(PROJECT, HEAD + "-2", "main", "t", "")
    assert forge.close(PROJECT, other.number).state == "closed"
    with pytest.raises(PullRequestNotOpen):
        forge.merge(PROJECT, other.number)


def test_unmergeable_is_a_merge_conflict(fake: FakeGitHub, forge: GitHubForge) -> None:
    pr = forge.open_pull_request(PROJECT, HEAD, "main", "t", "")
    fake.faults[("PUT", "/pulls/{n}/merge")].append(
        Fault(405, {"message": "Pull Request is not mergeable"})
    )
    with pytest.raises(MergeConflict, match="not mergeable"):
        forge.merge(PROJECT, pr.number)


def test_no_token_in_any_log_or_error(
    fake: FakeGitHub, forge: GitHubForge, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("github", "urllib3", "requests", "app"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    fake.faults[("POST", "/pulls")].append(
        Fault(403, {"message": "secondary rate limit"}, {"Retry-After": "1"})
    )
    pr = forge.open_pull_request(PROJECT, HEAD, "main", "t", "")
    forge.comment(PROJECT, pr.number, "hello")
    fake.faults[("PUT", "/pulls/{n}/merge")].append(
        Fault(422, {"message": f"bad token {TOKEN}"})
    )  # a server that echoes it back
    errors = []
    try:
        forge.merge(PROJECT, pr.number)
    except Exception as exc:
        errors.append(f"{exc!r} {exc}")
    forge.close(PROJECT, pr.number)
    assert errors and TOKEN not in errors[0]
    assert any(r.name.startswith("github") for r in caplog.records)
    assert any(r.name.startswith("urllib3") for r in caplog.records)
    assert TOKEN not in caplog.text
    for record in caplog.records:
        assert TOKEN not in record.getMessage()


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://github.com/lab/research.git", "lab/research"),
        ("https://ghe.example/lab/research", "lab/research"),
        ("git@github.com:lab/research.git", "lab/research"),
        ("ssh://git@github.com/lab/research.git", "lab/research"),
    ],
)
def test_github_repo_names(url: str, name: str) -> None:
    assert github_repo(url) == name


@pytest.mark.skipif(
    not (
        os.environ.get("AUTOPILOT_TEST_GITHUB_TOKEN")
        and os.environ.get("AUTOPILOT_TEST_GITHUB_REPO")
    ),
    reason="AUTOPILOT_TEST_GITHUB_TOKEN and AUTOPILOT_TEST_GITHUB_REPO are not set",
)
def test_live_github(tmp_path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """Push a branch to a real repository, open its PR twice (one PR), comment, close."""
    from app.git.work import GitWork
    from tests.integration.forge.gitrepo import plain_settings

    caplog.set_level(logging.DEBUG)
    token = os.environ["AUTOPILOT_TEST_GITHUB_TOKEN"]
    repo = os.environ["AUTOPILOT_TEST_GITHUB_REPO"]
    settings = plain_settings(
        tmp_path,
        forge="github",
        github_token=token,
        github_base_url=os.environ.get("AUTOPILOT_TEST_GITHUB_API", "https://api.github.com"),
    )
    forge = GitHubForge.from_settings(settings)
    gh_repo = forge._repo(ProjectRef("live", f"https://github.com/{repo}.git"))
    project = ProjectRef("live", f"https://github.com/{repo}.git", gh_repo.default_branch)
    work = GitWork(settings)
    cycle = os.urandom(4).hex()
    wt = work.start_branch("live", project.repo_url, project.default_branch, cycle, "live test")
    work.commit_files(wt, {f"autopilot-live-{cycle}.txt": b"live test\n"}, "live test")
    work.push(wt, project.repo_url)
    first = forge.open_pull_request(project, wt.branch, project.default_branch, "live test", "")
    second = forge.open_pull_request(project, wt.branch, project.default_branch, "live test", "")
    try:
        assert first.number == second.number
        forge.comment(project, first.number, "autopilot live test")
    finally:
        forge.close(project, first.number)
        gh_repo.get_git_ref(f"heads/{wt.branch}").delete()
    assert token not in caplog.text


@pytest.mark.parametrize("make", [harness_cycle, command_cycle], ids=["harness", "command"])
def test_the_pull_request_body_stands_alone_on_github(
    fake: FakeGitHub, forge: GitHubForge, make: Callable[[], tuple[Cycle, dict[str, Any]]]
) -> None:
    """What GitHub receives: the verdict with ratio and CI, the gate, the results table, the
    plot as an image of the file at the results commit, hypothesis, environment, reproduce
    line and the dashboard and findings links; no token anywhere."""
    cycle, result = make()
    where = links(cycle, PROJECT, forge, DASHBOARD)
    forge.open_pull_request(
        PROJECT,
        f"{HEAD}-{cycle.id}",
        "main",
        pr_title(cycle),
        pr_body(cycle, PROJECT, result, where),
    )
    body = fake.pulls[-1]["body"]
    blob = f"https://github.example/lab/research/blob/{COMMIT}/results/{cycle.id}"
    command = cycle.experiment == "train"
    for expected in (
        f"**Verdict: {cycle.verdict}**, ratio ",
        "(candidate / baseline, 95% bootstrap CI; A/A noise floor",
        "Check gate `val_loss`" if command else "Accuracy gate: **pass**",
        "| arm | commit |" if command else "| variant | baseline median |",
        f"]({blob}/plot.svg?raw=true)",
        f"[the whole report, REPORT.md]({blob}/REPORT.md)",
        "## Hypothesis\n\nFusing the two FFT passes halves the time",
        "## What changed\n\nkernel.py fuses the passes",
        "## Environment",
        f"autopilot job submit --project spectral --experiment {cycle.experiment}",
        f"[dashboard]({DASHBOARD}/cycles/{cycle.id})",
        f"[the findings it proposes]({DASHBOARD}/cycles/{cycle.id}#own-h)",
    ):
        assert expected in body, expected
    assert TOKEN not in body and "/api/v3" not in body


def test_file_urls_refuse_what_is_not_a_commit_or_a_repository_path(forge: GitHubForge) -> None:
    assert forge.file_url(PROJECT, COMMIT, "results/7/plot.svg") == (
        f"https://github.example/lab/research/blob/{COMMIT}/results/7/plot.svg"
    )
    for sha, path in (("main", "a.txt"), ("c" * 39, "a.txt"), (COMMIT, "../a"), (COMMIT, "")):
        with pytest.raises(InvalidInput):
            forge.file_url(PROJECT, sha, path)
