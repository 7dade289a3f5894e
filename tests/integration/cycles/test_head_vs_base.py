"""A harness experiment whose cycle changed code is judged head against base (issue 16): the entry
module runs at the base commit and at the head commit, interleaved in the same lease, and that
comparison is the verdict. An agent that slows the in-process *baseline* so that its variant
looks faster gets `faster` in process but not from head against base, and the reviewer is told
the baseline moved."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from app.db import Stores
from app.jobs.models import Job
from tests.integration.cycles.test_command_cycle import committed, run_cycle
from tests.integration.queue.conftest import Workers
from tests.support import committed_repo

# A verdict on measured speed: one at a time (tests/conftest.py, `timing`).
pytestmark = pytest.mark.timing

CONFIG = """
[project]
name = "{name}"
gpu_kind = "cpu"
protected_paths = ["timing/main.py"]

[experiments.timing]
entry = "timing.main"
repeats = 6
time_limit_s = 60

[experiments.timing.parameters]
n = [20000]

[experiments.timing.defaults]
n = 20000

[agent]
kind = "command"
command = ["{python}", "agent.py"]
time_limit_s = 60
"""

# The experiment side of the protocol without torch: times the in-process baseline `plain`
# against the variant `fast`, interleaved, and writes the raw paired samples.
MAIN = """
import json, os, time
from timing import kernels

spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))
n = int(spec["parameters"]["n"])


def timed(fn):
    started = time.perf_counter_ns()
    fn(n)
    return time.perf_counter_ns() - started


a, b, a2 = [], [], []
for _ in range(25):
    a.append(timed(kernels.plain))
    b.append(timed(kernels.fast))
    a2.append(timed(kernels.plain))
json.dump({"status": "ok", "experiment": spec["experiment"], "parameters": spec["parameters"],
           "noise_floor": {"samples": {"a_ns": a, "b_ns": a2}},
           "comparisons": [{"variant": "fast", "baseline": "plain",
                            "samples": {"a_ns": a, "b_ns": b},
                            "accuracy": {"max_abs_error": 0.0, "scale": 1.0}}]},
          open(os.environ["AUTOPILOT_RESULT"], "w"))
"""

KERNELS = """
def plain(n):
    return sum(i * i for i in range(n))


def fast(n):
    return sum(i * i for i in range(n // 2))
"""

# The agent "speeds up" its variant by slowing the baseline it is compared with.
AGENT = """
import json, os, pathlib
path = pathlib.Path("timing/kernels.py")
path.write_text(path.read_text().replace("range(n))", "range(3 * n))"))
json.dump({"hypothesis": "the fast variant beats plain", "experiment": "timing",
           "parameters": {"n": 20000}, "what_changed": "timing/kernels.py: plain"},
          open(os.environ["AUTOPILOT_PROPOSAL"], "w"))
"""


@pytest.fixture
def queue_sandbox() -> str:
    return "on"


def timing_repo(root: Path, name: str) -> Path:
    files = {
        "timing/__init__.py": "",
        "timing/main.py": MAIN,
        "timing/kernels.py": KERNELS,
        "agent.py": AGENT,
        "autopilot.toml": CONFIG.format(name=name, python=sys.executable),
    }
    return committed_repo(root, name, files, "a timed kernel")


def test_a_slowed_baseline_is_not_a_faster_variant_head_against_base(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Any
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one backend is enough: the judgement does not depend on the stores")
    name = "head-vs-base"
    repo = timing_repo(tmp_path, name)
    cycle = run_cycle(workers, stores, repo, {"project": name})
    cycle_id = cycle["id"]
    head = cycle["headline"]
    # In process, `fast` now beats a baseline made three times slower...
    assert head["in_process"]["verdict"] == "faster", head
    # ...but `fast` itself is no faster at head than at base.
    assert cycle["verdict"] == head["verdict"] == "inconclusive", head
    assert head["variant"] == "fast" and head["baseline"] == "base"
    assert head["disagreements"] == 1, head

    with stores.ops_session() as session:
        job = session.query(Job).filter_by(cycle_id=cycle_id).one()
        raw = dict(job.result or {})
        base_sha, head_sha = job.base_sha, job.head_sha
        assert job.spec["head_vs_base"] is True
    section = raw["head_vs_base"]
    assert (section["arms"]["baseline"]["commit"], section["arms"]["candidate"]["commit"]) == (
        base_sha,
        head_sha,
    )
    assert len(section["samples"]["candidate"]) == 6
    moved = section["in_process_baseline"]
    # plain: 3x the work at head
    assert statistics.median(moved["candidate"]) > 1.5 * statistics.median(moved["baseline"])

    judged = json.loads(committed(workers, name, cycle, "result.json"))
    assert judged["verdict"] == "inconclusive"
    assert judged["comparisons"][0]["verdict"] == "faster"  # the in-process figures are kept
    (line,) = judged["judgement"]["disagreements"]
    assert line.startswith("The in-process baseline `plain` itself takes ")
    report = committed(workers, name, cycle, "REPORT.md")
    assert "**Verdict: inconclusive**" in report and "changed baseline" in report
