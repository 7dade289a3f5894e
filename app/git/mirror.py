"""Reading a repository through a mirror, on whichever host needs it: a file at a branch's tip
of a repository not registered yet, and a job's commit fetched by a GPU host and exported clean
(docs/design.md, "Hosts and boundaries")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

from app.git.exceptions import GitFailed, InvalidRef
from app.git.refs import REMOTE_PREFIX
from app.git.runner import (
    check_branch_name,
    check_url,
    fetch_failure,
    git_program,
    repo_lock,
)
from app.git.work import GitWork

_SHA = re.compile(r"^[0-9a-f]{7,64}$")


def fetch_commit(
    work: GitWork,
    project: str,
    url: str,
    branch: str,
    sha: str | None,
    *,
    extra_env: Mapping[str, str] | None = None,
) -> tuple[Path, str]:
    """Fetch one branch of `url` into the project's mirror and return (mirror, commit): the
    commit `sha` (which must be on that branch's history) or, without one, the branch tip."""
    check_url(url)
    check_branch_name(branch)
    if sha is not None and not _SHA.fullmatch(sha):
        raise InvalidRef(f"{sha!r} is not a commit sha")
    mirror = work.mirror_path(project)
    with repo_lock(mirror):
        if not (mirror / "HEAD").exists():
            mirror.mkdir(parents=True, exist_ok=True)
            work.git.run(["init", "--bare", "--quiet", str(mirror)], mirror.parent)
        try:
            work.git.run(
                [
                    "fetch",
                    "--quiet",
                    "--no-tags",
                    "--end-of-options",
                    url,
                    f"+refs/heads/{branch}:{REMOTE_PREFIX}{branch}",
                ],
                mirror,
                url=url,
                extra_env=extra_env,
            )
        except GitFailed as exc:
            raise fetch_failure(exc, url, branch) from None
        tip = work.git.run(["rev-parse", f"{REMOTE_PREFIX}{branch}^{{commit}}"], mirror)
        if sha is None:
            return mirror, tip
        if not work.git.ok(["merge-base", "--is-ancestor", sha, tip], mirror):
            raise InvalidRef(
                f"commit {sha[:12]} is no longer on branch {branch!r} of the forge "
                "(force-pushed or rewritten since the job was submitted)"
            )
    return mirror, sha


def holds(work: GitWork, project: str, sha: str) -> bool:
    """Whether the project's mirror on this host holds commit `sha`."""
    cache = work.mirror_path(project)
    if not _SHA.fullmatch(sha) or not (cache / "HEAD").exists():
        return False
    return work.git.ok(["cat-file", "-e", f"{sha}^{{commit}}"], cache)


def _bytecode(name: str) -> bool:
    parts = name.split("/")
    return "__pycache__" in parts or name.endswith((".pyc", ".pyo"))


def export(work: GitWork, mirror: Path, sha: str, dest: Path) -> Path:
    """A clean export of `sha` (its tree, no .git, no bytecode even where a commit holds some,
    nothing else) at `dest`, made once."""
    if dest.is_dir():
        return dest
    # The commit's own .gitattributes may not drop or rewrite files of the export
    # (export-ignore, export-subst): this repository's attributes win over the tree's.
    attributes = mirror / "info" / "attributes"
    attributes.parent.mkdir(parents=True, exist_ok=True)
    attributes.write_text("* -export-ignore -export-subst\n")
    staging = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    # argv only, a validated sha: GitPython cannot hand its stdout over as a stream
    path = os.environ.get("PATH", "")
    with subprocess.Popen(  # noqa: S603
        [git_program(path), "archive", "--format=tar", sha],
        cwd=mirror,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**work.git.env(), "GIT_DIR": str(mirror), "PATH": path},
    ) as archive:
        assert archive.stdout is not None
        with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
            for member in tar:
                if not _bytecode(member.name):
                    tar.extract(member, staging, filter="data")
        error = archive.stderr.read().decode(errors="replace") if archive.stderr else ""
    if archive.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise GitFailed(f"git archive {sha[:12]} failed: {work.git.redact(error.strip())}")
    staging.rename(dest)
    return dest


def read_remote(work: GitWork, url: str, branch: str, path: str) -> tuple[str, str | None]:
    """Read `path` at the tip of `branch` of any repository, before it has a mirror (a
    project being registered): a shallow fetch into a scratch bare repository."""
    check_url(url)
    check_branch_name(branch)
    work.repos_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".probe-", dir=work.repos_dir))
    try:
        work.git.run(["init", "--bare", "--quiet", str(scratch)], work.repos_dir)
        try:
            work.git.run(
                [
                    "fetch",
                    "--quiet",
                    "--no-tags",
                    "--depth=1",
                    "--end-of-options",
                    url,
                    f"refs/heads/{branch}",
                ],
                scratch,
                url=url,
            )
        except GitFailed as exc:
            raise fetch_failure(exc, url, branch) from None
        sha = work.git.run(["rev-parse", "FETCH_HEAD^{commit}"], scratch)
        try:
            return sha, work.git.run(["cat-file", "blob", f"{sha}:{path}"], scratch)
        except GitFailed:
            return sha, None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
