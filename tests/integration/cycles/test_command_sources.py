"""A candidate that manufactures its own win, on the shipped tiny_train (copied into a git repo
with candidate commits beside its base), through a real GPU worker (sandboxed preparation,
arms and hold-out evaluator) and the control plane's judge: each attack ends in no trusted win,
with the reason in the judged result (docs/design.md, "Where a number comes from").

Jobs are submitted as a cycle submits them (head and base commits), all at once to one worker;
each is judged as the cycle's analyze step judges it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import git
import pytest

from app import broker
from app.cycles.judge import judge
from app.cycles.judge.command import trusted_win
from app.db import Stores
from app.git import protected
from app.git.exceptions import GitFailed, ProtectedPathChanged
from app.jobs import service as jobs
from app.jobs.models import Job
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.reports.cycle import ReportContext, render_markdown
from tests.conftest import Backend
from tests.integration.queue.conftest import Workers
from tests.integration.queue.test_workers import finished
from tests.support import wait_for

# A verdict on measured speed: one at a time (tests/conftest.py, `timing`).
pytestmark = pytest.mark.timing

TINY_TRAIN = Path(__file__).resolve().parents[3] / "experiments" / "projects" / "tiny_train"
CHEAT = "time 0.000001ms"  # what a cheating candidate prints: far below any honest step time

# Besides the shipped `train` (runner's clock, hold-out gate), the same script read from its own
# output: by pattern, and from a metric file a small wrapper of the base commit writes.
EXTRA_EXPERIMENTS = """
[experiments.printed]
kind = "command"
command = ["python", "train.py", "--log-every=50"]
metric = "step_ms"
metric_pattern = 'time (?P<value>[0-9.]+)ms'
repeats = 3
time_limit_s = 30

[experiments.filed]
kind = "command"
command = ["python", "timed.py"]
metric = "step_ms"
metric_file = "metric.json"
metric_key = "step_ms"
repeats = 3
time_limit_s = 30

# The runner's clock with blocks that stop when decided (docs/design.md, "Sequential verdicts").
[experiments.stopped]
kind = "command"
command = ["python", "train.py", "--log-every=50"]
metric = "run_s"
metric_source = "wall"
direction = "lower"
repeats = 8
stopping = "sequential"
time_limit_s = 30
"""
TIMED = '''"""train.py, its median step time written to metric.json."""
import contextlib, io, json, re, statistics
import train

out = io.StringIO()
with contextlib.redirect_stdout(out):
    train.main(["--log-every=50"])
times = [float(t) for t in re.findall(r"time ([0-9.]+)ms", out.getvalue())]
json.dump({"step_ms": statistics.median(times)}, open("metric.json", "w"))
'''
RETURN = "    return 0\n\n\nif __name__"
LAST_LINE = '    print(f"val loss {model.loss(val):.4f}")\n'

# Each candidate: the files it changes, as (path, old, new) replacements or whole texts.
CANDIDATES: dict[str, list[tuple[str, str, str]]] = {
    "stdout": [("train.py", LAST_LINE, LAST_LINE + f'    print("{CHEAT}")\n')],
    "stderr": [("train.py", LAST_LINE, LAST_LINE + f'    print("{CHEAT}", file=sys.stderr)\n')],
    "atexit": [
        (
            "train.py",
            "import argparse\n",
            f'import argparse\nimport atexit\natexit.register(print, "{CHEAT}")\n',
        )
    ],
    "file": [
        (
            "timed.py",
            'json.dump({"step_ms": statistics.median(times)}',
            'json.dump({"step_ms": 0.000001}',
        )
    ],
    # every trick at once, against the runner's clock: none of them is read
    "all": [
        ("train.py", LAST_LINE, LAST_LINE + f'    print("{CHEAT}")\n'),
        (
            "train.py",
            "import argparse\n",
            f'import argparse\nimport atexit\natexit.register(print, "{CHEAT}")\n',
        ),
    ],
    # the hold-out data: it would tell the candidate what to fit
    "peek": [
        (
            "train.py",
            "    args = parse_args(argv)\n",
            "    args = parse_args(argv)\n"
            "    import os\n"
            '    print("holdout:", "present" if os.path.exists("holdout/data.json") else "absent")\n',
        )
    ],
    # skip the training (4x faster on the clock) and write a model that claims a tiny loss
    "forged": [
        (
            "train.py",
            "    window_loss = 0.0\n",
            "    args.out.parent.mkdir(parents=True, exist_ok=True)\n"
            '    args.out.write_text(json.dumps({"width": 1, "w1": [1.0], "b1": [0.0], '
            '"w2": [0.0], "b2": 0.0, "loss": 1e-9, "holdout_loss": 1e-9}))\n'
            '    print("val loss 0.0001")\n'
            "    return 0\n"
            "    window_loss = 0.0\n",
        )
    ],
    # an honest change that costs time: each step is taken ten times over
    "slower": [
        (
            "train.py",
            "        loss = model.sgd_step(batch, args.lr)\n",
            "        loss = model.sgd_step(batch, args.lr)\n"
            "        for _ in range(9):\n"
            "            model.sgd_step(batch, 0.0)\n",
        )
    ],
    # the attacks on the judge itself: refused before any job, as a protected path is
    "evaluator": [("holdout/evaluate.py", "return total / len(points)", "return 1e-9")],
    "data": [("holdout/data.json", '"points": [[', '"points": [[0.0, 0.0], [')],
}
JOBS = {  # job name: (candidate, experiment)
    "stdout": ("stdout", "printed"),
    "stderr": ("stderr", "printed"),
    "atexit": ("atexit", "printed"),
    "file": ("file", "filed"),
    "wall": ("all", "train"),
    "peek": ("peek", "train"),
    "forged": ("forged", "train"),
    "slower": ("slower", "train"),
    "stopped": ("slower", "stopped"),
}


@pytest.fixture
def queue_sandbox() -> str:
    """The workers run the candidates sandboxed, as a GPU host does."""
    return "on"


def commit(repo: git.Repo, message: str) -> str:
    repo.git.add("--all")
    actor = git.Actor("t", "t@example.invalid")
    return repo.index.commit(message, author=actor, committer=actor).hexsha


def tiny_train(root: Path) -> tuple[Path, str, dict[str, str]]:
    """The shipped project as a lab's repository (fewer blocks, for speed), its base commit and
    one branch per candidate: name -> (head commit)."""
    repo_dir = root / "tiny-train"
    shutil.copytree(TINY_TRAIN, repo_dir, ignore=shutil.ignore_patterns("__pycache__", "out"))
    config = (repo_dir / "autopilot.toml").read_text()
    config = config.replace("repeats = 8", "repeats = 4")
    (repo_dir / "autopilot.toml").write_text(config + EXTRA_EXPERIMENTS)
    (repo_dir / "timed.py").write_text(TIMED)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    base = commit(repo, "tiny-train, onboarded")
    heads = {}
    for name, edits in CANDIDATES.items():
        repo.git.checkout("-q", "-b", name, base)
        for path, old, new in edits:
            text = (repo_dir / path).read_text()
            assert old in text, (name, path, old)
            (repo_dir / path).write_text(text.replace(old, new, 1))
        heads[name] = commit(repo, f"candidate: {name}")
    repo.git.checkout("-q", "main")
    return repo_dir, base, heads


def git_runner(repo_dir: Path):  # type: ignore[no-untyped-def]
    def run(args: list[str]) -> str:
        done = subprocess.run(
            ["git", "-C", str(repo_dir), *args], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise GitFailed(done.stderr)
        return done.stdout

    return run


def test_a_candidate_cannot_manufacture_a_trusted_win(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one back end: where a number comes from does not depend on the stores")
    repo_dir, base, heads = tiny_train(tmp_path)

    # A change to the evaluator or the hold-out data is refused like a protected path, by the
    # check every agent's commits go through (before any job is submitted).
    for name in ("evaluator", "data"):
        check = protected.check(git_runner(repo_dir), base, ref=heads[name])
        with pytest.raises(ProtectedPathChanged, match="holdout/"):
            check.raise_for_violations()
    assert protected.check(git_runner(repo_dir), base, ref=heads["slower"]).violations == []

    cfg = project_config.load(repo_dir)
    with stores.ops_session() as session:
        row = ops.create_project(session, ProjectCreate(name="tiny-train", repo_url=str(repo_dir)))
        ids = {
            name: jobs.submit(
                session,
                workers.settings,
                row,
                cfg,
                experiment,
                {},
                source=jobs.JobSource(str(repo_dir), candidate, heads[candidate], base),
            ).id
            for name, (candidate, experiment) in JOBS.items()
        }
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    broker.ring_gpu(workers.settings, "gpu.cpu")
    done: dict[str, Job] = {
        name: wait_for(lambda i=i: finished(stores, i), timeout=240) for name, i in ids.items()
    }
    for name, job in done.items():
        assert job.state == "succeeded", (name, job.error, workers.logs())
    judged = {
        name: judge(dict(job.result or {}), dict(job.spec or {})) for name, job in done.items()
    }

    # Printed to stdout, to stderr, at exit, written to the metric file: the runner read the
    # candidate's number (the verdict is what it makes of it, against this machine's A/A
    # floor), and the judgement says whose word that is.
    for name in ("stdout", "stderr", "atexit", "file"):
        got = judged[name]
        assert set(got["samples"]["candidate"]) == {0.000001}, name
        assert got["ratio"] < 0.01 and got["verdict"] in ("faster", "inconclusive"), name
        assert got["self_reported"] is True and got["trusted"] is False, name
        assert got["integrity"]["flags"][0].startswith("self-reported: `step_ms`"), name
        assert not trusted_win(got), name
    context = ReportContext(cycle_id="1", project="tiny-train", hypothesis="h", changes="c")
    report = render_markdown(judged["stdout"], context)
    assert f"**Verdict: {judged['stdout']['verdict']}** (self-reported: not a trusted win)" in (
        report
    )
    assert "> **Self-reported: not a trusted win.**" in report

    # Against the runner's clock every trick is ignored: each run's value is its wall time.
    wall = judged["wall"]
    assert wall["metric_source"] == "wall" and wall["trusted"] is True
    for run in done["wall"].result["runs"]:  # type: ignore[index]
        assert run["value"] == pytest.approx(run["duration_s"], abs=1e-6) and run["value"] > 0.01
    assert wall["verdict"] != "faster", wall["headline"]  # the candidate does the same work

    # A hidden path is absent from both arms' trees (the run saw none), present to the evaluator.
    logs = done["peek"].log_path
    runs_dir = Path(str(logs)).parent / "runs"
    peeks = [p.read_text() for p in runs_dir.glob("*-candidate.log")]
    assert peeks and all("holdout: absent" in text for text in peeks)
    job_dir = Path(str(logs)).parent
    assert (job_dir / "evaluator" / "holdout" / "data.json").is_file()
    assert not (job_dir / "src" / "holdout").exists()
    assert not (job_dir / "base" / "holdout").exists()
    assert judged["peek"]["check"]["pass"] is True  # the evaluator ran on both arms' models

    # A forged model: the clock says faster (it skipped training), the evaluator recomputes the
    # hold-out loss from its weights and the gate rejects it, whatever the file claims.
    forged = judged["forged"]
    assert forged["ratio"] < 1, forged["headline"]
    assert forged["verdict"] == "rejected_accuracy" and not trusted_win(forged)
    assert forged["check"]["candidate"] > 0.3 > 0.1 > forged["check"]["baseline"]
    assert "worse than the baseline's" in forged["check"]["reason"]
    # (as the evaluator was given it: each run's tree is a fresh copy, removed after the run)
    forged_run = next(r for r in done["forged"].result["runs"] if r["role"] == "candidate")  # type: ignore[index]
    artifacts = job_dir.parent / str(ids["forged"]) / "artifacts" / f"{forged_run['index']:03d}"
    claimed = json.loads((artifacts / "out" / "model.json").read_text())
    assert not (job_dir.parent / str(ids["forged"]) / "src" / "out").exists()
    assert claimed["holdout_loss"] == 1e-9  # what it claimed, and what was not believed

    # An honest change that costs time is still told apart on the runner's clock.
    slower = judged["slower"]
    assert slower["verdict"] == "slower" and slower["trusted"] is True, slower["headline"]
    assert slower["check"]["pass"] is True

    # The same honest change with blocks that stop when decided: the runner stopped before its
    # maximum, said why, and the judge took the stop (it refuses one its rule does not make).
    stopped = judged["stopped"]
    assert stopped["verdict"] == "slower" and stopped["trusted"] is True, stopped["headline"]
    blocks = stopped["stopped"]["blocks"]
    assert 3 <= blocks < 8 and stopped["stopped"]["decision"] == "effect", stopped["stopped"]
    assert stopped["headline"]["stopped"] == {
        "blocks": blocks,
        "decision": "effect",
        "blocks_saved": 8 - blocks,
        "max_blocks": 8,
    }
    assert len(done["stopped"].result["runs"]) == 3 * blocks  # type: ignore[index]
    assert done["stopped"].result["stopped"]["why"].startswith(f"after {blocks} of at most 8")  # type: ignore[index]
    report = render_markdown(stopped, context)
    assert f"Blocks: {blocks} of at most 8, decided: the difference crossed" in report
    assert f"{8 - blocks} blocks not run saved about" in report
