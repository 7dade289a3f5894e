"""Runs that cannot touch each other through their tree (docs/design.md, "Hosts and
boundaries"): each run of a command job, warm-up or recorded, starts from a fresh copy of its
arm's export, through a real sandboxed GPU worker on the shipped tiny_train (copied into a git
repo with a candidate commit beside its base), judged as a cycle's analyze step judges it.

The candidate tries two ways out: its warm-up computes the work once and caches the result in
its tree for the recorded runs to reload (a faster win on the runner's clock), and each run
plants start-up files (`sitecustomize.py`, a `.pth` in its tree and in its user site, a file
its own program reads at start) for the next run."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import git
import pytest

from app import broker
from app.cycles.judge import judge
from app.cycles.judge.command import trusted_win
from app.db import Stores
from app.jobs import service as jobs
from app.jobs.models import Job
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.conftest import Backend
from tests.integration.cycles.test_command_sources import TINY_TRAIN, commit
from tests.integration.queue.conftest import Workers
from tests.integration.queue.test_workers import finished
from tests.support import wait_for

EXPERIMENT = """
[experiments.cached]
kind = "command"
command = ["python", "cached.py"]
metric = "run_s"
metric_source = "wall"
direction = "lower"
repeats = 4
warmup_runs = 1
time_limit_s = 30
"""
WORK = """
def work():
    total = 0
    for i in range(1_500_000):
        total += i * i % 7
    return total
"""
BASE = f'"""A fixed amount of work, timed by the runner."""\n{WORK}\nprint("result", work())\n'
# The same work, done once: the warm-up's result is kept in the tree for the recorded runs.
CANDIDATE = f'''"""The work, cached in its tree; and start-up files planted for the next run."""
import builtins, json, os, site
{WORK}
PLANTS = [
    "sitecustomize.py",
    "planted.pth",
    "seed.txt",
    os.path.join(site.getusersitepackages(), "planted.pth"),
]
seen = [p for p in PLANTS if os.path.exists(p)]
if getattr(builtins, "PLANTED", False):
    seen.append("a planted start-up hook ran")
print("seen:", "; ".join(seen) or "none")
if os.path.exists("cache.json"):
    print("cache: hit")
    result = json.load(open("cache.json"))
else:
    print("cache: miss")
    result = work()
    json.dump(result, open("cache.json", "w"))
print("result", result)
hook = "import builtins; builtins.PLANTED = True\\n"
for path in PLANTS:
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as out:
            out.write(hook if path.endswith(".py") else hook if path.endswith(".pth") else "x")
    except OSError as exc:
        print("cannot plant", path, exc)
'''


@pytest.fixture
def queue_sandbox() -> str:
    """The worker runs the candidate sandboxed, as a GPU host does."""
    return "on"


def repository(root: Path) -> tuple[Path, str, str]:
    """tiny_train with the `cached` experiment: the repo, its base commit and the candidate's."""
    repo_dir = root / "tiny-train"
    subprocess.run(["cp", "-a", str(TINY_TRAIN), str(repo_dir)], check=True)
    for leftover in ("__pycache__", "out"):
        subprocess.run(["rm", "-rf", str(repo_dir / leftover)], check=True)
    with open(repo_dir / "autopilot.toml", "a") as config:
        config.write(EXPERIMENT)
    (repo_dir / "cached.py").write_text(BASE)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    base = commit(repo, "tiny-train with a cached experiment")
    repo.git.checkout("-q", "-b", "cached", base)
    (repo_dir / "cached.py").write_text(CANDIDATE)
    head = commit(repo, "candidate: cache the work, plant start-up files")
    repo.git.checkout("-q", "main")
    return repo_dir, base, head


def committed(repo_dir: Path, sha: str, hidden: str) -> dict[str, str]:
    """Each file of the commit (but its hidden paths) and the hash of its content."""
    repo = git.Repo(repo_dir)
    names = repo.git.ls_tree("-r", "--name-only", sha).splitlines()
    return {
        name: hashlib.sha256((repo.commit(sha).tree / name).data_stream.read()).hexdigest()
        for name in names
        if not name.startswith(hidden + "/")
    }


def hashed(tree: Path) -> dict[str, str]:
    return {
        str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in tree.rglob("*")
        if p.is_file() or p.is_symlink()
    }


def test_no_run_reaches_the_next_through_its_tree(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one back end: a run's tree does not depend on the stores")
    repo_dir, base, head = repository(tmp_path)
    cfg = project_config.load(repo_dir)
    with stores.ops_session() as session:
        row = ops.create_project(session, ProjectCreate(name="tiny-train", repo_url=str(repo_dir)))
        job_id = jobs.submit(
            session,
            workers.settings,
            row,
            cfg,
            "cached",
            {},
            source=jobs.JobSource(str(repo_dir), "cached", head, base),
        ).id
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    broker.ring_gpu(workers.settings, "gpu.cpu")
    job: Job = wait_for(lambda: finished(stores, job_id), timeout=120)
    assert job.state == "succeeded", (job.error, workers.logs())
    result = dict(job.result or {})
    job_dir = Path(str(job.log_path)).parent

    # Every run of the candidate, its warm-up too, did the work and saw nothing planted.
    candidate_runs = [r for r in result["runs"] if r["arm"] == "candidate"]
    assert {r["role"] for r in candidate_runs} == {"warmup", "candidate"}
    assert len(candidate_runs) == 5
    for run in candidate_runs:
        text = (job_dir / run["log"]).read_text()
        assert "cache: miss" in text and "cache: hit" not in text, (run, text)
        assert "seen: none" in text, (run, text)

    # So the cache bought nothing on the runner's clock: no trusted win.
    got = judge(result, dict(job.spec or {}))
    assert got["metric_source"] == "wall" and got["trusted"] is True
    assert got["verdict"] != "faster" and not trusted_win(got), got["headline"]

    # The exports the copies came from are the commits as exported, unchanged by any run, and
    # no run's copy is left behind.
    assert hashed(job_dir / "src") == committed(repo_dir, head, "holdout")
    assert hashed(job_dir / "base") == committed(repo_dir, base, "holdout")
    assert not (job_dir / "src" / "cache.json").exists()
    assert sorted(p.name for p in (job_dir / "runs").iterdir() if p.is_dir()) == []
