"""The forge steps a cycle calls: commit the results, publish the branch as a PR, merge safely.

Each is idempotent: called again after a crash it finds what the first call made (the commit,
the pushed branch, the open PR) and returns it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.db import Stores
from app.errors import AutopilotError
from app.forge.base import CommitState, Forge, ProjectRef, PullRequest
from app.forge.exceptions import PullRequestNotOpen
from app.git import mirror
from app.git.exceptions import BaseBranchMissing, MergeConflict
from app.git.refs import CycleBranch
from app.git.work import GitWork
from app.projects import config as project_config
from app.projects.config import CONFIG_FILE, ConfigError, ProjectConfig
from app.reports import cycle as report
from app.settings import Settings

log = logging.getLogger(__name__)

# (pull request, new base sha) -> (verdict holds, reason). The queue's implementation runs the
# experiment again as a job on the PR's head merged onto that base and compares verdicts.
Revalidate = Callable[[PullRequest, str], tuple[bool, str]]


#: The context of the commit status that shows a cycle's verdict on its PR's head.
VERDICT_CONTEXT = "autopilot/verdict"
_WIN = ("faster", "better")
_LOSS = ("slower", "worse", "rejected_accuracy")


def verdict_state(verdict: str | None) -> CommitState:
    """A verdict as a commit status: a win succeeds, a loss or a failed gate fails, and an
    inconclusive one succeeds too (GitHub has no neutral status; its description says it)."""
    return "failure" if verdict in _LOSS else "success"


def show_verdict(
    forge: Forge,
    project: ProjectRef,
    sha: str | None,
    verdict: str | None,
    description: str,
    target_url: str,
) -> bool:
    """The verdict as a commit status on `sha` (the PR's head), linking to the cycle's page.
    Best effort: the PR is what a reviewer needs, so a forge that refuses only logs."""
    if not sha:
        return False
    try:
        forge.set_commit_status(
            project, sha, verdict_state(verdict), description, target_url, VERDICT_CONTEXT
        )
    except AutopilotError as exc:
        log.warning("no verdict status on %s of %s: %s", sha[:12], project.name, exc.detail)
        return False
    return True


def forge_for(settings: Settings, stores: Stores, **options: Any) -> Forge:
    """The forge the settings name: the local forge (embedded default) or GitHub."""
    if settings.forge == "github":
        from app.forge.github import GitHubForge

        return GitHubForge.from_settings(settings, **options)
    from app.forge.local import LocalForge

    return LocalForge(settings, stores)


def config_at_base(
    git_work: GitWork, forge: Forge, project: ProjectRef
) -> tuple[str, ProjectConfig]:
    """The commit a cycle starts from (the tip of the project's base branch on the forge,
    brought up to the project's repository first) and the `autopilot.toml` at that commit.

    A fetch that fails raises FetchFailed (transient); a commit without the file, ConfigError
    naming the file and the commit."""
    forge.sync_base(project)
    sha, text = git_work.read_at(
        project.name, forge.remote_url(project), project.default_branch, CONFIG_FILE
    )
    return sha, _parse_at(sha, project.default_branch, text)


def config_at_url(git_work: GitWork, url: str, branch: str) -> tuple[str, ProjectConfig]:
    """`autopilot.toml` at the tip of `branch` of a repository not registered yet."""
    sha, text = mirror.read_remote(git_work, url, branch, CONFIG_FILE)
    return sha, _parse_at(sha, branch, text)


def config_at_commit(git_work: GitWork, project: str, sha: str, branch: str) -> ProjectConfig:
    """`autopilot.toml` at a commit already in the project's mirror (a cycle's candidate)."""
    return _parse_at(sha, branch, git_work.show(project, sha, CONFIG_FILE))


def _parse_at(sha: str, branch: str, text: str | None) -> ProjectConfig:
    if text is None:
        raise ConfigError(
            f"{CONFIG_FILE}: missing at commit {sha[:12]} of branch {branch!r}; "
            f"a research repository needs {CONFIG_FILE} at its root"
        )
    return project_config.parse(text, f"{CONFIG_FILE} at commit {sha[:12]}")


def _allowed(cycle_id: str) -> list[str]:
    return [report.results_dir(cycle_id) + "/"]


def commit_results(
    git_work: GitWork,
    branch: CycleBranch,
    result: Mapping[str, Any],
    context: report.ReportContext,
    *,
    message: str | None = None,
) -> str:
    """Commit `results/<cycle>/` (result.json, REPORT.md, plot.svg) on top of the cycle's
    candidate, from objects (no directory anyone else could write is read). Returns the sha."""
    title = context.hypothesis.strip().splitlines()[0] if context.hypothesis.strip() else ""
    verdict = result.get("verdict") or result.get("status") or "no verdict"
    return git_work.commit_files(
        branch,
        report.render_files(result, context),
        message
        or f"{title or 'Cycle ' + context.cycle_id} ({verdict})\n\nCycle {context.cycle_id}",
        allowed=_allowed(context.cycle_id),
    )


def publish(
    git_work: GitWork,
    forge: Forge,
    project: ProjectRef,
    branch: CycleBranch,
    cycle_id: str,
    *,
    title: str,
    body: str,
) -> PullRequest:
    """Bring the cycle's branch to the forge and open (or find) its pull request. Where the
    forge is on this host and holds the branch already (a sweep's, placed at its base), it
    takes the new commits without a push (`Forge.take_branch`); else a push."""
    allowed, sha = _allowed(cycle_id), git_work.tip(branch)
    if sha != branch.base_sha:  # checked as the push checks it, before the forge has it
        git_work.check_protected(branch, ref=sha, allowed=allowed)
    if not forge.take_branch(project, branch.mirror, branch.branch, sha):
        git_work.push(branch, forge.remote_url(project), allowed=allowed)
    return forge.open_pull_request(project, branch.branch, branch.base, title, body)


@dataclass(frozen=True)
class MergeOutcome:
    merged: bool
    pull_request: PullRequest
    reason: str
    base_sha: str | None
    revalidations: int


def merge_with_revalidation(
    forge: Forge,
    git_work: GitWork,
    project: ProjectRef,
    number: int,
    *,
    run_base_sha: str,
    revalidate: Revalidate,
    expected_head_sha: str | None = None,
    message: str | None = None,
    max_rounds: int = 3,
) -> MergeOutcome:
    """Merge PR `number` only if its result holds on the base it merges into.

    If the base moved since the run (`run_base_sha`), `revalidate` re-runs the experiment on
    the new base; the PR merges only if the verdict holds, else the reason goes on the PR as a
    comment and it stays open. A base that keeps moving is re-validated up to `max_rounds`.
    """
    url = forge.remote_url(project)
    validated = run_base_sha
    rounds = 0
    while True:
        pr = forge.get_pull_request(project, number)
        if pr.state == "merged":
            return MergeOutcome(True, pr, "already merged", validated, rounds)
        if pr.state != "open":
            raise PullRequestNotOpen(f"pull request #{number} is {pr.state}; it cannot be merged")
        current = git_work.remote_head(url, pr.base)
        if current is None:
            raise BaseBranchMissing(f"base branch {pr.base!r} of #{number} is gone from the remote")
        if current == validated:
            try:
                merged = forge.merge(
                    project,
                    number,
                    message=message,
                    expected_head_sha=expected_head_sha or pr.head_sha,
                )
            except MergeConflict as exc:
                forge.comment(project, number, f"Not merged: {exc.detail}")
                return MergeOutcome(False, pr, exc.detail, validated, rounds)
            reason = "merged" if rounds == 0 else f"merged after {rounds} re-validation(s)"
            return MergeOutcome(True, merged, reason, validated, rounds)
        if rounds >= max_rounds:
            reason = (
                f"the base `{pr.base}` kept moving ({rounds} re-validations, now at "
                f"{current[:12]}); merge again when it is quiet"
            )
            forge.comment(project, number, f"Not merged: {reason}.")
            return MergeOutcome(False, pr, reason, validated, rounds)
        rounds += 1
        holds, why = revalidate(pr, current)
        if not holds:
            reason = (
                f"the base `{pr.base}` moved from {validated[:12]} to {current[:12]} since this "
                f"result was measured, and re-running the experiment on the new base did not "
                f"confirm the verdict: {why}"
            )
            forge.comment(project, number, f"Not merged: {reason}")
            return MergeOutcome(False, pr, reason, validated, rounds)
        forge.comment(
            project,
            number,
            f"Re-validated on the new base `{pr.base}` at {current[:12]}: {why}",
        )
        validated = current
