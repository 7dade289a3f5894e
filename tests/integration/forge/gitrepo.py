"""Real git repositories for forge tests: a research repo with a harness, and bare remotes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from app.agents import workspace
from app.agents.workspace import Workspace
from app.git.refs import CycleBranch
from app.git.work import GitWork
from app.settings import Settings

AUTOPILOT_TOML = """\
[protected]
paths = ["experiments/harness/", "eval/*.py"]

[experiments.matmul]
entry = "bench.matmul"
"""


def git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "Lab Person",
        "GIT_AUTHOR_EMAIL": "person@lab.example",
        "GIT_COMMITTER_NAME": "Lab Person",
        "GIT_COMMITTER_EMAIL": "person@lab.example",
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin:/usr/local/bin",
    }
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def make_origin(tmp: Path, name: str = "origin") -> Path:
    """A bare remote whose `main` holds autopilot.toml, a harness, an eval and some code."""
    work = tmp / f"{name}-seed"
    work.mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    files = {
        "autopilot.toml": AUTOPILOT_TOML,
        "experiments/harness/judge.py": "TOLERANCE = 1e-6\n",
        "eval/score.py": "def score(x):\n    return x\n",
        "src/kernel.py": "def kernel(x):\n    return x * 2\n",
        "README.md": "# research\n",
    }
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "seed")
    bare = tmp / f"{name}.git"
    git(tmp, "clone", "-q", "--bare", str(work), str(bare))
    return bare


def commit_to(remote: Path, tmp: Path, branch: str, path: str, text: str) -> str:
    """Land a commit on `branch` of `remote` from a separate clone (someone else's work)."""
    clone = tmp / f"other-{abs(hash((str(remote), path, text)))}"
    git(tmp, "clone", "-q", "-b", branch, str(remote), str(clone))
    (clone / path).parent.mkdir(parents=True, exist_ok=True)
    (clone / path).write_text(text)
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", f"change {path}")
    git(clone, "push", "-q", "origin", branch)
    return git(clone, "rev-parse", "HEAD")


def plain_settings(tmp: Path, **extra: object) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=tmp / "state",
        memory_url=f"sqlite:///{tmp / 'memory.db'}",
        ops_url=f"sqlite:///{tmp / 'ops.db'}",
        git_author_name="Autopilot Test",
        git_author_email="autopilot@test.example",
        **extra,
    )


def harness_result(verdict: str = "faster") -> dict[str, object]:
    a = [1000.0 + i for i in range(20)]
    b = [800.0 + i for i in range(20)]
    return {
        "schema_version": "1.0",
        "status": "ok",
        "experiment": "matmul",
        "parameters": {"n": 256},
        "device": "cpu",
        "repeats": 20,
        "ratio": 0.8,
        "ci_low": 0.78,
        "ci_high": 0.82,
        "verdict": verdict,
        "comparisons": [
            {
                "variant": "fused",
                "ratio": 0.8,
                "ci_low": 0.78,
                "ci_high": 0.82,
                "n": 20,
                "verdict": verdict,
                "samples": {"a_ns": a, "b_ns": b, "order": ["AB"] * 20},
                "accuracy": {"max_rel_error": 1e-7, "pass": True, "reason": None},
            }
        ],
        "thread_sweep": {
            "threads": [1, 2],
            "points": {
                "baseline": [
                    {"threads": 1, "time_ns": 1000, "calls_per_s": 1e6},
                    {"threads": 2, "time_ns": 600, "calls_per_s": 1.6e6},
                ]
            },
        },
        "environment": {"python": "3.11.9", "torch": "2.4.0", "device_name": "cpu"},
    }


def agent_change(
    work: GitWork,
    branch: CycleBranch,
    tmp: Path,
    edits: dict[str, str | None],
    *,
    commit: bool = False,
) -> Path | None:
    """What an agent's run leaves: a scratch clone with `edits` (None deletes), committed by
    the agent itself or not, packed into a bundle the way the plan step does it."""
    space = Workspace(tmp / "agent" / branch.branch.rsplit("/", 1)[-1])
    space.reset()
    work.scratch_clone(branch, space.repo)
    for path, text in edits.items():
        target = space.repo / path
        if text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    if commit:
        git(space.repo, "add", "-A")
        git(space.repo, "commit", "-qm", "agent")
    return workspace.pack(
        space,
        branch.base_sha,
        name=f"t-pack-{os.getpid()}",
        author=("a", "a@b"),
        message="m",
        enabled=False,
    )
