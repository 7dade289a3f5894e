"""GitWork against real git: mirrors, cycle branches, the agent's bundle, commits made from
objects, pushes, a moving base, bad input."""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict
from pathlib import Path

import pytest
from pydantic import SecretStr

from app.agents import workspace
from app.agents.workspace import Workspace
from app.git import refs, refstore
from app.git.exceptions import (
    AgentWorkRefused,
    BaseBranchMissing,
    GitFailed,
    InvalidRef,
    ProtectedPathChanged,
    PushFailed,
    PushRejected,
    TransportNotAllowed,
)
from app.git.runner import GitRunner
from app.git.work import GitWork
from tests.integration.forge.gitrepo import (
    agent_change,
    commit_to,
    git,
    make_origin,
    plain_settings,
)

RESULTS = ["results/c0ffee01/"]


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    return make_origin(tmp_path)


@pytest.fixture
def work(tmp_path: Path) -> GitWork:
    return GitWork(plain_settings(tmp_path), push_attempts=3, push_backoff_s=0.01)


def test_branch_agent_work_results_push_round_trip(
    work: GitWork, origin: Path, tmp_path: Path
) -> None:
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01-aaaa", "Fuse the FFT")
    assert br.branch == "autopilot/spectral/c0ffee01-fuse-the-fft"
    assert (tmp_path / "state" / "repos" / "spectral.git" / "HEAD").exists()
    assert br.base_sha == git(origin, "rev-parse", "main") == work.tip(br)

    bundle = agent_change(
        work, br, tmp_path, {"src/kernel.py": "def kernel(x):\n    return x + x\n"}
    )
    head = work.take_agent_work(br, bundle)
    assert head != br.base_sha and work.tip(br) == head
    assert work.show("spectral", head, "src/kernel.py") == "def kernel(x):\n    return x + x"
    files = {"results/c0ffee01/result.json": b"{}\n"}
    sha = work.commit_files(br, files, "Fuse the FFT", allowed=RESULTS)
    assert work.commit_files(br, files, "Fuse the FFT", allowed=RESULTS) == sha  # idempotent
    mirror = br.mirror
    assert git(mirror, "log", "-1", "--format=%an <%ae>|%cn", sha) == (
        "Autopilot Test <autopilot@test.example>|Autopilot Test"
    )
    assert git(mirror, "rev-parse", f"{sha}^") == head

    assert work.push(br, str(origin), allowed=RESULTS) == sha
    assert work.push(br, str(origin), allowed=RESULTS) == sha  # idempotent
    assert git(origin, "rev-parse", br.branch) == sha
    assert work.remote_head(str(origin), br.branch) == sha

    again = work.start_branch("spectral", str(origin), "main", "c0ffee01-aaaa", "Fuse the FFT")
    assert again == br and work.tip(again) == sha
    with pytest.raises(BaseBranchMissing, match="does not exist"):
        work.start_branch("spectral", str(origin), "develop", "c0ffee01", "x")


def test_base_that_moves_under_a_running_cycle(work: GitWork, origin: Path, tmp_path: Path) -> None:
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "tile")
    started_on = br.base_sha
    moved = commit_to(origin, tmp_path, "main", "src/other.py", "X = 1\n")
    # The cycle is resumed (say after a crash): it keeps the base it measured against.
    resumed = work.start_branch("spectral", str(origin), "main", "c0ffee01", "tile")
    assert resumed.base_sha == started_on != moved
    bundle = agent_change(
        work, br, tmp_path, {"src/kernel.py": "def kernel(x):\n    return 2 * x\n"}
    )
    sha = work.take_agent_work(br, bundle)
    work.push(br, str(origin))
    assert git(origin, "rev-parse", br.branch) == sha
    assert work.remote_head(str(origin), "main") == moved
    assert git(origin, "merge-base", "main", br.branch) == started_on


@pytest.mark.parametrize(
    ("path", "action"),
    [
        ("experiments/harness/judge.py", "edit"),
        ("experiments/harness/judge.py", "delete"),
        ("experiments/harness/new_judge.py", "add"),
        ("eval/score.py", "edit"),
        ("autopilot.toml", "edit"),
        ("results/older/result.json", "add"),
    ],
)
@pytest.mark.parametrize("committed", [False, True])
def test_protected_paths_are_refused(
    work: GitWork, origin: Path, tmp_path: Path, path: str, action: str, committed: bool
) -> None:
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "cheat")
    text = (
        None
        if action == "delete"
        else "TOLERANCE = 1.0  # the agent makes its result look better\n"
    )
    bundle = agent_change(work, br, tmp_path, {path: text}, commit=committed)
    with pytest.raises(ProtectedPathChanged) as caught:
        work.take_agent_work(br, bundle)
    assert path in caught.value.detail
    assert caught.value.extra["paths"] == [path]
    assert work.tip(br) == br.base_sha  # nothing was taken


def test_protected_path_turned_into_a_symlink_is_refused(
    work: GitWork, origin: Path, tmp_path: Path
) -> None:
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "link")
    space = Workspace(tmp_path / "agent-link")
    space.reset()
    work.scratch_clone(br, space.repo)
    judge = space.repo / "experiments" / "harness" / "judge.py"
    (space.repo / "src" / "lenient.py").write_text("TOLERANCE = 1.0\n")
    judge.unlink()
    judge.symlink_to("lenient.py")  # points down: only the protected check can refuse it
    bundle = workspace.pack(
        space, br.base_sha, name=f"t-{os.getpid()}", author=("a", "a@b"), message="m", enabled=False
    )
    with pytest.raises(ProtectedPathChanged, match="experiments/harness/judge.py"):
        work.take_agent_work(br, bundle)


def test_results_written_by_the_autopilot_pass_but_not_elsewhere(
    work: GitWork, origin: Path, tmp_path: Path
) -> None:
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "ok")
    bundle = agent_change(
        work, br, tmp_path, {"src/kernel.py": "def kernel(x):\n    return x << 1\n"}
    )
    work.take_agent_work(br, bundle)
    check = work.check_protected(br, allowed=RESULTS)
    assert check.violations == []
    assert "experiments/harness/judge.py" in check.base_hashes
    assert check.base_hashes == check.candidate_hashes
    work.commit_files(br, {"results/c0ffee01/REPORT.md": b"# ok\n"}, "ok", allowed=RESULTS)
    with pytest.raises(ProtectedPathChanged):
        work.commit_files(br, {"results/other/REPORT.md": b"# no\n"}, "no", allowed=RESULTS)


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c touch% /tmp/autopilot-pwned",
        "fd::3",
        "-uhttps://example.com/x.git",
        "--upload-pack=touch /tmp/x",
        "relative/path",
        "https://example.com/x.git\nmore",
    ],
)
def test_disallowed_transports_are_refused(work: GitWork, url: str) -> None:
    with pytest.raises(TransportNotAllowed):
        work.fetch("spectral", url)
    with pytest.raises(TransportNotAllowed):
        work.start_branch("spectral", url, "main", "c0ffee01", "x")


def test_git_itself_refuses_ext_even_if_validation_were_bypassed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    runner = GitRunner(author=("a", "a@b"))
    with pytest.raises(GitFailed):
        runner.run(["ls-remote", "--end-of-options", f"ext::sh -c touch% {marker}"], tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "base", ["a..b", "-main", "--upload-pack=x", "ma in", "main~1", "x@{1}", ""]
)
def test_bad_base_refs_are_refused(work: GitWork, origin: Path, base: str) -> None:
    with pytest.raises(InvalidRef):
        work.start_branch("spectral", str(origin), base, "c0ffee01", "x")


def test_missing_base_branch(work: GitWork, origin: Path) -> None:
    with pytest.raises(BaseBranchMissing, match="does not exist"):
        work.start_branch("spectral", str(origin), "develop", "c0ffee01", "x")


def test_remote_that_rejects_the_push(tmp_path: Path, origin: Path) -> None:
    hook = origin / "hooks" / "pre-receive"
    hook.write_text(
        "#!/bin/sh\necho 'branch policy: autopilot branches are not allowed' >&2\nexit 1\n"
    )
    hook.chmod(0o755)
    sleeps: list[float] = []
    work = GitWork(
        plain_settings(tmp_path), push_attempts=3, push_backoff_s=0.01, sleep=sleeps.append
    )
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "x")
    work.take_agent_work(br, agent_change(work, br, tmp_path, {"src/kernel.py": "pass\n"}))
    with pytest.raises(PushRejected) as caught:
        work.push(br, str(origin))
    assert br.branch in caught.value.detail
    assert "pre-receive hook declined" in caught.value.detail
    assert "branch policy" in caught.value.detail
    assert sleeps == []  # a refusal is not retried
    assert caught.value.status == 502 and caught.value.slug == "push-rejected"


def test_transient_push_failure_is_retried_and_credentials_never_leak(
    tmp_path: Path, origin: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = "ghp_supersecretTOKEN1234567890"
    sleeps: list[float] = []
    work = GitWork(
        plain_settings(tmp_path),
        token=SecretStr(token),
        push_attempts=3,
        push_backoff_s=0.01,
        sleep=sleeps.append,
    )
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "x")
    work.take_agent_work(br, agent_change(work, br, tmp_path, {"src/kernel.py": "pass\n"}))
    # Nothing listens on port 1: connection refused, a transient failure.
    url = f"https://x-access-token:{token}@127.0.0.1:1/lab/research.git"
    with pytest.raises(PushFailed) as caught:
        work.push(br, url)
    assert sleeps == [0.01, 0.02]
    assert "failed 3 times" in caught.value.detail
    assert token not in caught.value.detail and token not in str(caught.value)
    # The token as a header (no credentials in the URL) does not leak either.
    with pytest.raises(PushFailed) as second:
        work.push(br, "https://127.0.0.1:1/lab/research.git")
    assert token not in str(second.value)
    with pytest.raises(GitFailed) as third:
        work.fetch("spectral", url)
    assert token not in str(third.value)
    assert token not in caplog.text
    assert "127.0.0.1:1" in caplog.text or caplog.records  # something was logged at all


def test_branch_names() -> None:
    assert refs.branch_name("proj", "C0FFEE01-2222-3333", "Use TF32 / tensor cores!") == (
        "autopilot/proj/c0ffee01-use-tf32-tensor-cores"
    )
    for project in ("-x", "a..b", "A B", "../etc"):
        with pytest.raises(InvalidRef):
            refs.branch_name(project, "c0ffee01", "x")
    for cycle in ("../x", "-1", "a b", ""):
        with pytest.raises(InvalidRef):
            refs.branch_name("proj", cycle, "x")


def test_links_that_climb_are_refused_even_in_a_chain(
    work: GitWork, origin: Path, tmp_path: Path
) -> None:
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "chain")
    space = Workspace(tmp_path / "agent-chain")
    space.reset()
    work.scratch_clone(br, space.repo)
    (space.repo / "d1" / "d2").mkdir(parents=True)
    (space.repo / "d1" / "d2" / "l1").symlink_to("../..")
    (space.repo / "l2").symlink_to("d1/d2/l1/../../../../etc/passwd")
    bundle = workspace.pack(
        space, br.base_sha, name=f"t-{os.getpid()}", author=("a", "a@b"), message="m", enabled=False
    )
    with pytest.raises(AgentWorkRefused) as caught:
        work.take_agent_work(br, bundle)
    assert "d1/d2/l1" in caught.value.detail and "l2" in caught.value.detail
    assert work.tip(br) == br.base_sha


@pytest.mark.parametrize(
    "shadow", ["src/reference/__init__.py", "src/reference.cpython-311-x86_64-linux-gnu.so"]
)
def test_a_module_that_would_shadow_a_protected_one_is_refused(
    work: GitWork, origin: Path, tmp_path: Path, shadow: str
) -> None:
    config = '[protected]\npaths = ["src/reference.py"]\n'
    commit_to(origin, tmp_path, "main", "autopilot.toml", config)
    commit_to(origin, tmp_path, "main", "src/reference.py", "def ref(x):\n    return x\n")
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "shadow")
    bundle = agent_change(work, br, tmp_path, {shadow: "def ref(x):\n    return 0\n"})
    with pytest.raises(ProtectedPathChanged, match=re.escape(shadow)):
        work.take_agent_work(br, bundle)


def test_a_results_commit_refuses_a_bad_path_or_clash_and_moves_nothing(
    work: GitWork, origin: Path
) -> None:
    """Every file is committed, or the commit fails: git's batch index input would skip an
    invalid path (`a//b`) and settle a file/directory clash by deleting, both silently."""
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01-aaaa", "x")
    clash = {"results/c0ffee01": b"a file\n"}
    tip = work.commit_files(br, clash, "a file where a directory goes", allowed=RESULTS)
    for files in (
        {"results/c0ffee01//REPORT.md": b"# r\n", "results/c0ffee01/result.json": b"{}\n"},
        {"results/c0ffee01/./REPORT.md": b"# r\n"},
        {"results/c0ffee01/REPORT.md": b"# r\n"},  # under the file of the same name
    ):
        with pytest.raises(GitFailed):
            work.commit_files(br, files, "bad", allowed=RESULTS)
        assert work.tip(br) == tip


def _packs(repo: Path) -> int:
    counts = dict(line.split(": ") for line in git(repo, "count-objects", "-v").splitlines())
    return int(counts["packs"])


def test_git_upkeep_runs_once_per_so_many_writes_not_after_each(
    work: GitWork, origin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A push no longer runs receive-pack's `gc --auto` (nor a fetch `maintenance --auto`):
    `gitrunner.upkeep` runs it every few writes, so a repository is still kept packed."""
    from app.git import runner as gitrunner
    from app.git.upkeep import Upkeep

    monkeypatch.setattr(gitrunner, "upkeep", Upkeep(every=3, period_s=1e9))
    # Each push keeps its pack, and two packs are one too many for `gc --auto`, which runs in
    # the foreground here so that its result shows at once.
    for key, value in (("transfer.unpackLimit", "1"), ("gc.autoPackLimit", "1")):
        git(origin, "config", key, value)
    git(origin, "config", "gc.autoDetach", "false")
    br = work.start_branch("spectral", str(origin), "main", "c0ffee01", "upkeep")
    packs = [_packs(origin)]
    for n in range(3):  # pushes: writes 1 (the first: upkeep checks, 1 pack is fine), 2, 3
        work.commit_files(br, {f"results/c0ffee01/{n}.json": b"%d\n" % n}, "r", allowed=RESULTS)
        work.push(br, str(origin), allowed=RESULTS)
        packs.append(_packs(origin))
    assert packs == [0, 1, 2, 3]  # receive-pack left them: no `gc --auto` after a push
    work.commit_files(br, {"results/c0ffee01/3.json": b"3\n"}, "r", allowed=RESULTS)
    work.push(br, str(origin), allowed=RESULTS)  # write 4: upkeep's maintenance repacks
    assert _packs(origin) == 1
    assert git(origin, "rev-parse", br.branch) == work.tip(br)
    git(origin, "fsck", "--no-progress")


def test_a_step_reads_its_branch_tip_with_one_git(
    work: GitWork, origin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later step's branch (its base recorded) costs one git in a process that has not seen
    its tip yet and none once it has (read from the mirror's files); its tip none more; and a
    commit moves the tip it remembers."""
    first = work.start_branch("spectral", str(origin), "main", "c0ffee01", "tips")
    sha = work.commit_files(first, {"results/c0ffee01/r.json": b"{}\n"}, "r", allowed=RESULTS)
    calls: list[str] = []
    real = GitRunner.run_bytes

    def counted(self: GitRunner, args: list[str], *a: object, **k: object) -> bytes:
        calls.append(args[0])
        return real(self, args, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(GitRunner, "run_bytes", counted)
    monkeypatch.setattr(refstore, "_commits", OrderedDict())  # a process that did not commit it
    later = GitWork(plain_settings(tmp_path))  # the next step's own
    branch = later.start_branch(
        "spectral", str(origin), "main", "c0ffee01", "tips", base_sha=first.base_sha
    )
    assert branch == first and later.tip(branch) == sha
    assert calls == ["for-each-ref"]
    again = GitWork(plain_settings(tmp_path)).start_branch(
        "spectral", str(origin), "main", "c0ffee01", "tips", base_sha=first.base_sha
    )
    assert again == first and calls == ["for-each-ref"]
    files = {"results/c0ffee01/r.json": b"[]\n"}
    moved = later.commit_files(branch, files, "again", allowed=RESULTS)
    assert later.tip(branch) == moved == git(branch.mirror, "rev-parse", branch.branch) != sha
