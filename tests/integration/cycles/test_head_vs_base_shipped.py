"""An agent's code change to a shipped harness project gets a verdict: the real
`experiments/projects/complex_contraction`, its kernels edited by an agent, runs through a real
cycle (control and GPU workers, sandboxed) and is judged head against base (docs/design.md,
"Experiment kinds"). The job's spec carries keys for the worker (`head_vs_base`) that the
harness's protocol refuses; the experiment process must see only the protocol's keys."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import git
import pytest

from app.db import Stores
from app.jobs.models import Job
from tests.integration.cycles.test_command_cycle import committed, run_cycle
from tests.integration.queue.conftest import Workers

# A verdict on measured speed: one at a time (tests/conftest.py, `timing`).
pytestmark = pytest.mark.timing

SHIPPED = Path(__file__).resolve().parents[3] / "experiments" / "projects" / "complex_contraction"

# The agent makes `gauss` (the headline variant) do its whole contraction three times.
AGENT = """
import json, os, pathlib
path = pathlib.Path("contraction/kernels.py")
text = path.read_text()
slow = text.replace(
    "    return torch.complex(k1 - k3, k1 + k2)\\n",
    "    for _ in range(2):\\n"
    "        k1 = torch.einsum(EQUATION, a + b, c)\\n"
    "        k2 = torch.einsum(EQUATION, a, d - c)\\n"
    "        k3 = torch.einsum(EQUATION, b, c + d)\\n"
    "    return torch.complex(k1 - k3, k1 + k2)\\n",
)
assert slow != text, "kernels.py no longer has the line this agent edits"
path.write_text(slow)
json.dump({"hypothesis": "gauss recomputed is no slower", "experiment": "contraction",
           "parameters": {"batch": 4, "channels": 8, "modes": 16},
           "what_changed": "contraction/kernels.py: gauss"},
          open(os.environ["AUTOPILOT_PROPOSAL"], "w"))
"""


@pytest.fixture
def queue_sandbox() -> str:
    return "on"


def shipped_repo(root: Path, name: str) -> Path:
    """complex_contraction as a lab has it, with an agent, tiny defaults and few blocks."""
    repo_dir = root / name
    shutil.copytree(SHIPPED, repo_dir, ignore=shutil.ignore_patterns("__pycache__"))
    config = repo_dir / "autopilot.toml"
    text = config.read_text()
    text = text.replace('name = "complex-contraction"', f'name = "{name}"')
    # torch and numpy come from the host's packages (the test venvs inherit them)
    text = text.replace('python_requirements = ["numpy>=1.26"]', "python_requirements = []")
    text = text.replace("time_limit_s = 600\n", "time_limit_s = 120\nrepeats = 3\n", 1)
    text = text.replace(
        "batch = 8\nchannels = 16\nmodes = 32", "batch = 4\nchannels = 8\nmodes = 16"
    )
    text += f'\n[agent]\nkind = "command"\ncommand = ["{sys.executable}", "agent.py"]\n'
    text += "time_limit_s = 60\n"
    config.write_text(text)
    (repo_dir / "agent.py").write_text(AGENT)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.git.add("--all")
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("the shipped complex contraction", author=actor, committer=actor)
    return repo_dir


def test_an_agents_change_to_the_shipped_contraction_is_judged_head_against_base(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Any
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one backend is enough: the judgement does not depend on the stores")
    name = "shipped-contraction"
    repo = shipped_repo(tmp_path, name)
    cycle = run_cycle(workers, stores, repo, {"project": name})
    head = cycle["headline"]

    with stores.ops_session() as session:
        job = session.query(Job).filter_by(cycle_id=cycle["id"]).one()
        assert job.spec["head_vs_base"] is True
        assert job.state == "succeeded", (job.state, job.error)
        raw = dict(job.result or {})
        base_sha, head_sha = job.base_sha, job.head_sha
    assert base_sha != head_sha
    # The harness ran (it refuses a spec with a key it does not know), in process...
    assert raw["status"] == "ok", raw.get("error")
    assert raw["comparisons"][0]["variant"] == "gauss_3mult"
    # ...and at base and at head, arm against arm.
    section = raw["head_vs_base"]
    assert (section["arms"]["baseline"]["commit"], section["arms"]["candidate"]["commit"]) == (
        base_sha,
        head_sha,
    )
    assert len(section["samples"]["candidate"]) == 3
    # gauss does three times its work at head: judged, and judged slower.
    assert head["variant"] == "gauss_3mult" and head["baseline"] == "base", head
    assert cycle["verdict"] == head["verdict"] == "slower", head
    judged = json.loads(committed(workers, name, cycle, "result.json"))
    assert judged["verdict"] == "slower"
