"""The local forge end to end on SQLite and PostgreSQL: branch, commit, report, PR, merge."""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.db import Stores
from app.forge import service
from app.forge.base import ProjectRef, PullRequest
from app.forge.exceptions import HeadMoved, PullRequestNotFound, PullRequestNotOpen
from app.forge.local import LocalForge
from app.git.exceptions import InvalidRef
from app.git.refs import CycleBranch
from app.git.work import GitWork
from app.reports.cycle import ReportContext
from app.settings import Settings
from tests.integration.forge.gitrepo import (
    agent_change,
    commit_to,
    git,
    harness_result,
    make_origin,
)

# Both stacks: concurrent opens meet PostgreSQL's partial unique index.
pytestmark = pytest.mark.stores("sqlite", "postgres")

CYCLE = "c0ffee01"


@pytest.fixture
def project(tmp_path: Path) -> ProjectRef:
    return ProjectRef("spectral", str(make_origin(tmp_path)), "main")


@pytest.fixture
def forge(settings: Settings, stores: Stores) -> LocalForge:
    return LocalForge(settings, stores)


@pytest.fixture
def work(settings: Settings) -> GitWork:
    return GitWork(settings, push_attempts=2, push_backoff_s=0.01)


def report_context(
    project: ProjectRef, wt: CycleBranch, cycle: str, hypothesis: str, changes: str
) -> ReportContext:
    return ReportContext(
        cycle_id=cycle,
        project=project.name,
        hypothesis=hypothesis,
        changes=changes,
        reproduce="autopilot cycle rerun x",
        base_sha=wt.base_sha,
    )


def run_cycle(
    work: GitWork,
    forge: LocalForge,
    project: ProjectRef,
    cycle: str = CYCLE,
    change: str = "def kernel(x):\n    return x + x\n",
) -> tuple[CycleBranch, str, PullRequest]:
    wt = work.start_branch(project.name, forge.remote_url(project), "main", cycle, "fuse")
    if work.tip(wt) == wt.base_sha:  # the agent ran once (the plan step is not repeated)
        bundle = agent_change(work, wt, work.repos_dir.parent, {"src/kernel.py": change})
        work.take_agent_work(wt, bundle)
    context = report_context(project, wt, cycle, "Fusing halves time", "kernel uses an add")
    sha = service.commit_results(work, wt, harness_result(), context)
    pr = service.publish(work, forge, project, wt, cycle, title="Fuse", body="body")
    return wt, sha, pr


def test_cycle_to_pull_request_is_idempotent(
    work: GitWork, forge: LocalForge, project: ProjectRef, settings: Settings
) -> None:
    wt, sha, pr = run_cycle(work, forge, project)
    bare = settings.state_dir.absolute() / "forge" / "spectral.git"
    assert forge.remote_url(project) == str(bare)
    assert pr.number == 1 and pr.state == "open" and pr.head == wt.branch and pr.base == "main"
    assert pr.head_sha == sha == git(bare, "rev-parse", wt.branch)
    files = git(bare, "ls-tree", "-r", "--name-only", sha).splitlines()
    assert {
        f"results/{CYCLE}/result.json",
        f"results/{CYCLE}/REPORT.md",
        f"results/{CYCLE}/plot.svg",
    } <= set(files)

    # Everything again, as after a crash: same commit, same PR, still one PR.
    _, sha2, pr2 = run_cycle(work, forge, project)
    assert (sha2, pr2) == (sha, pr)
    assert forge.open_pull_request(project, wt.branch, "main", "again", "") == pr
    assert [p.number for p in forge.list_pull_requests(project)] == [1]
    diff = forge.diff(project, 1)
    assert "src/kernel.py" in diff and f"results/{CYCLE}/REPORT.md" in diff
    assert forge.get_pull_request(project, 1) == pr


def test_concurrent_opens_make_one_pull_request(
    work: GitWork, forge: LocalForge, project: ProjectRef
) -> None:
    wt, _, first = run_cycle(work, forge, project)
    forge.close(project, first.number)
    with ThreadPoolExecutor(4) as pool:
        prs = list(
            pool.map(
                lambda _: forge.open_pull_request(project, wt.branch, "main", "t", ""), range(8)
            )
        )
    assert len({p.number for p in prs}) == 1
    assert [p.state for p in forge.list_pull_requests(project)] == ["closed", "open"]


def test_concurrent_opens_of_many_heads_get_distinct_numbers(
    forge: LocalForge, project: ProjectRef
) -> None:
    """A control worker's threads publish many cycles of one project at once (the load test
    once lost a cycle to three number collisions in a row)."""
    base = git(Path(forge.remote_url(project)), "rev-parse", "main")
    heads = [f"autopilot/spectral/{n}-sweep" for n in range(16)]
    assert all(forge.place_branch(project, head, base) for head in heads)
    with ThreadPoolExecutor(8) as pool:
        prs = list(pool.map(lambda h: forge.open_pull_request(project, h, "main", h, ""), heads))
    assert sorted(p.number for p in prs) == list(range(1, 17))
    assert {p.head for p in prs} == set(heads)


def test_open_needs_a_pushed_head(forge: LocalForge, project: ProjectRef) -> None:
    with pytest.raises(InvalidRef, match="push it"):
        forge.open_pull_request(project, "autopilot/spectral/nothing", "main", "t", "")
    with pytest.raises(InvalidRef):
        forge.open_pull_request(project, "--exec=x", "main", "t", "")


def test_merge_makes_a_merge_commit_in_the_bare_repo(
    work: GitWork, forge: LocalForge, project: ProjectRef, settings: Settings
) -> None:
    wt, sha, pr = run_cycle(work, forge, project)
    bare = Path(forge.remote_url(project))
    before = git(bare, "rev-parse", "main")
    with pytest.raises(HeadMoved):
        forge.merge(project, pr.number, expected_head_sha="0" * 40)
    merged = forge.merge(project, pr.number, expected_head_sha=sha)
    assert merged.state == "merged" and merged.merge_sha == git(bare, "rev-parse", "main")
    parents = git(bare, "rev-list", "--parents", "-n", "1", "main").split()[1:]
    assert parents == [before, sha]
    assert git(bare, "log", "-1", "--format=%an", "main") == settings.git_author_name
    assert forge.merge(project, pr.number) == merged  # idempotent
    assert "src/kernel.py" in forge.diff(project, pr.number)
    other = run_cycle(work, forge, project, "beef0002", change="def kernel(x):\n    return 0\n")[2]
    forge.close(project, other.number)
    with pytest.raises(PullRequestNotOpen):
        forge.merge(project, other.number)
    with pytest.raises(PullRequestNotFound):
        forge.get_pull_request(project, 99)


def test_comment_and_close(work: GitWork, forge: LocalForge, project: ProjectRef) -> None:
    _, _, pr = run_cycle(work, forge, project)
    forge.comment(project, pr.number, "looks good")
    assert forge.comments(project, pr.number) == ["looks good"]
    closed = forge.close(project, pr.number)
    assert closed.state == "closed"
    assert forge.close(project, pr.number) == closed


# -- re-validation before merge ------------------------------------------------------------


class Revalidator:
    def __init__(self, holds: bool, reason: str) -> None:
        self.holds, self.reason = holds, reason
        self.calls: list[tuple[int, str]] = []

    def __call__(self, pr: PullRequest, base_sha: str) -> tuple[bool, str]:
        self.calls.append((pr.number, base_sha))
        return self.holds, self.reason


def test_unmoved_base_merges_without_revalidation(
    work: GitWork, forge: LocalForge, project: ProjectRef
) -> None:
    wt, _, pr = run_cycle(work, forge, project)
    check = Revalidator(False, "never asked")
    outcome = service.merge_with_revalidation(
        forge, work, project, pr.number, run_base_sha=wt.base_sha, revalidate=check
    )
    assert outcome.merged and outcome.revalidations == 0 and check.calls == []


def test_moved_base_verdict_does_not_hold(
    work: GitWork, forge: LocalForge, project: ProjectRef, tmp_path: Path
) -> None:
    wt, _, pr = run_cycle(work, forge, project)
    bare = Path(forge.remote_url(project))
    moved = commit_to(bare, tmp_path, "main", "src/other.py", "FAST = True\n")
    check = Revalidator(False, "ratio 0.99 [0.97, 1.01] is inconclusive on the new base")
    outcome = service.merge_with_revalidation(
        forge, work, project, pr.number, run_base_sha=wt.base_sha, revalidate=check
    )
    assert not outcome.merged
    assert check.calls == [(pr.number, moved)]
    assert forge.get_pull_request(project, pr.number).state == "open"
    assert git(bare, "rev-parse", "main") == moved  # nothing merged
    (comment,) = forge.comments(project, pr.number)
    assert "moved from" in comment and "inconclusive on the new base" in comment


def test_moved_base_verdict_holds(
    work: GitWork, forge: LocalForge, project: ProjectRef, tmp_path: Path
) -> None:
    wt, sha, pr = run_cycle(work, forge, project)
    bare = Path(forge.remote_url(project))
    moved = commit_to(bare, tmp_path, "main", "src/other.py", "FAST = True\n")
    check = Revalidator(True, "ratio 0.81 [0.79, 0.83], still faster")
    outcome = service.merge_with_revalidation(
        forge, work, project, pr.number, run_base_sha=wt.base_sha, revalidate=check
    )
    assert outcome.merged and outcome.revalidations == 1 and outcome.base_sha == moved
    assert git(bare, "rev-list", "--parents", "-n", "1", "main").split()[1:] == [moved, sha]
    assert "Re-validated" in forge.comments(project, pr.number)[0]


def test_moved_base_that_conflicts_is_reported(
    work: GitWork, forge: LocalForge, project: ProjectRef, tmp_path: Path
) -> None:
    wt, _, pr = run_cycle(work, forge, project)
    bare = Path(forge.remote_url(project))
    commit_to(bare, tmp_path, "main", "src/kernel.py", "def kernel(x):\n    return 3 * x\n")
    outcome = service.merge_with_revalidation(
        forge,
        work,
        project,
        pr.number,
        run_base_sha=wt.base_sha,
        revalidate=Revalidator(True, "holds"),
    )
    assert not outcome.merged and "does not merge cleanly" in outcome.reason
    assert forge.get_pull_request(project, pr.number).state == "open"
    assert "does not merge cleanly" in forge.comments(project, pr.number)[-1]


def sweep_results(
    work: GitWork, forge: LocalForge, project: ProjectRef, cycle: str
) -> tuple[CycleBranch, str]:
    """A sweep's cycle as far as its publish: the branch placed on the forge at its base (as
    prepare places it), the results committed on it in the mirror."""
    wt = work.start_branch(project.name, forge.remote_url(project), "main", cycle, "sweep")
    assert forge.place_branch(project, wt.branch, wt.base_sha)
    context = report_context(project, wt, cycle, "A sweep point", "")
    return wt, service.commit_results(work, wt, harness_result(), context)


def test_a_sweeps_results_reach_the_forge_without_a_push(
    work: GitWork,
    forge: LocalForge,
    project: ProjectRef,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wt, sha = sweep_results(work, forge, project, "5eed0001")

    def no_push(*_: object, **__: object) -> str:
        raise AssertionError("pushed")

    monkeypatch.setattr(work, "push", no_push)
    pr = service.publish(work, forge, project, wt, "5eed0001", title="Sweep", body="body")
    bare = settings.state_dir.absolute() / "forge" / "spectral.git"
    assert pr.head_sha == sha == git(bare, "rev-parse", wt.branch)
    git(bare, "fsck", "--strict", "--no-dangling")  # every object the tip reaches is there
    assert "results/5eed0001/REPORT.md" in git(bare, "ls-tree", "-r", "--name-only", sha)
    assert forge.take_branch(project, wt.mirror, wt.branch, sha)  # there already: done


def test_a_branch_the_copy_cannot_take_is_pushed(
    work: GitWork, forge: LocalForge, project: ProjectRef, settings: Settings
) -> None:
    bare = settings.state_dir.absolute() / "forge" / "spectral.git"
    # Packed by the mirror's upkeep: no loose object to copy.
    wt, sha = sweep_results(work, forge, project, "5eed0002")
    git(wt.mirror, "repack", "-a", "-d", "-q")
    git(wt.mirror, "prune-packed")
    assert not forge.take_branch(project, wt.mirror, wt.branch, sha)
    service.publish(work, forge, project, wt, "5eed0002", title="Sweep", body="")
    assert git(bare, "rev-parse", wt.branch) == sha
    # A loose object whose content is not what its name says is not copied (git checks an
    # object against its name as it receives it; so does the copy).
    wt, sha = sweep_results(work, forge, project, "5eed0003")
    blob = git(wt.mirror, "rev-parse", f"{sha}:results/5eed0003/REPORT.md")
    loose = wt.mirror / "objects" / blob[:2] / blob[2:]
    loose.chmod(0o644)
    loose.write_bytes(zlib.compress(b"blob 4\0evil"))
    assert not forge.take_branch(project, wt.mirror, wt.branch, sha)
    assert not (bare / "objects" / blob[:2] / blob[2:]).exists()
    assert git(bare, "rev-parse", wt.branch) == wt.base_sha  # the branch did not move
    # Not a fast-forward of the forge's branch; and a branch the forge does not have.
    tree = git(wt.mirror, "rev-parse", f"{wt.base_sha}^{{tree}}")
    orphan = git(wt.mirror, "commit-tree", tree, "-m", "no parent")
    assert not forge.take_branch(project, wt.mirror, wt.branch, orphan)
    wt4, sha4 = sweep_results(work, forge, project, "5eed0004")
    git(bare, "update-ref", "-d", f"refs/heads/{wt4.branch}")
    assert not forge.take_branch(project, wt4.mirror, wt4.branch, sha4)


def test_a_plan_reads_an_unmoved_base_without_fetching_it_again(
    work: GitWork,
    forge: LocalForge,
    project: ProjectRef,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = forge.remote_url(project)
    sha, text = work.read_at(project.name, url, "main", "autopilot.toml")
    commands: list[str] = []
    run_bytes = work.git.run_bytes

    def seen(args: list[str], cwd: Path, **options: object) -> bytes:
        commands.append(next(a for a in args if not a.startswith("-") and "=" not in a))
        return run_bytes(args, cwd, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(work.git, "run_bytes", seen)
    assert work.read_at(project.name, url, "main", "autopilot.toml") == (sha, text)
    assert "fetch" not in commands  # the forge's main is where the last fetch left it
    moved = commit_to(Path(url), tmp_path, "main", "autopilot.toml", text + "\n# moved\n")
    assert work.read_at(project.name, url, "main", "autopilot.toml")[0] == moved != sha
    assert "fetch" in commands
