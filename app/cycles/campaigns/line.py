"""A campaign's line in git: a branch of the project's mirror, pushed to its forge, that starts
at the base and only fast-forwards, to a candidate confirmed on the tip it started from."""

from __future__ import annotations

from app.forge import service as forge_service
from app.forge.base import Forge, ProjectRef
from app.git.exceptions import InvalidRef
from app.git.refs import BRANCH_PREFIX, CycleBranch, check_sha
from app.git.runner import check_branch_name, repo_lock
from app.git.work import GitWork
from app.projects.config import ProjectConfig


def name(project: str, campaign_id: int) -> str:
    """`autopilot/<project>/campaign-<id>`: beside the cycles' branches, never one of them."""
    return check_branch_name(f"{BRANCH_PREFIX}/{project}/campaign-{campaign_id}")


def open_line(
    git: GitWork, project: ProjectRef, campaign_id: int, start_sha: str, *, create: bool = False
) -> CycleBranch:
    """The line in the mirror (made at `start_sha` when `create` and it is absent)."""
    mirror = git.mirror_path(project.name)
    line = CycleBranch(
        project.name,
        name(project.name, campaign_id),
        project.default_branch,
        check_sha(start_sha),
        mirror,
    )
    if create:
        with repo_lock(mirror):
            if line.ref not in git.git.ref_tips(mirror, line.ref):
                git.git.run(["update-ref", line.ref, start_sha, ""], mirror)
    return line


def start(
    git: GitWork, forge: Forge, project: ProjectRef, campaign_id: int
) -> tuple[str, str, ProjectConfig]:
    """Make the line at the base's tip now and push it: its name, its start and the config
    there. A line of that name left by an earlier campaign (an id reused after its project was
    deleted) is refused rather than built on."""
    base_sha, config = forge_service.config_at_base(git, forge, project)
    line = open_line(git, project, campaign_id, base_sha, create=True)
    sha = git.tip(line)
    if sha != base_sha and not git.git.ok(
        ["merge-base", "--is-ancestor", base_sha, sha], line.mirror
    ):
        raise InvalidRef(
            f"branch {line.branch} already exists and does not start at the base: delete it "
            "from the project's mirror and forge, or start another campaign"
        )
    git.push(line, forge.remote_url(project))
    return line.branch, sha, config


def advance(
    git: GitWork,
    forge: Forge,
    project: ProjectRef,
    campaign_id: int,
    *,
    start_sha: str,
    tip_sha: str,
    to_sha: str,
) -> None:
    """Fast-forward the line from `tip_sha` to `to_sha` (a kept step's candidate, made on that
    tip) and push it: a push that is not a fast-forward is refused by git. Done again after a
    crash, it finds the line there and pushes nothing new."""
    line = open_line(git, project, campaign_id, start_sha)
    git.move_branch(line, to_sha, after=tip_sha)
    git.push(line, forge.remote_url(project))
