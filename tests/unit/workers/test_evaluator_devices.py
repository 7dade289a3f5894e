"""The hold-out evaluator gets the GPUs of its run only, numbered inside as the run's are
(`confine.gpu_nodes`, `confine.visible_inside`), never every GPU of the host. A real evaluator
process runs (on this host's CPU: the fake device nodes are recorded, not bound)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from app.sandbox import bwrap, confined
from app.settings import Settings
from workers import evaluator as evaluator_module
from workers.arms import program
from workers.evaluator import Evaluator, evaluate
from workers.launcher import confine

VENV = Path(sys.prefix)


def test_the_evaluator_sees_its_runs_gpus_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        confine, "_dev_names", lambda: ["nvidia0", "nvidia1", "nvidia2", "nvidiactl", "dri"]
    )
    seen: list[bwrap.Policy] = []
    real_run = confined.run

    def recorded(argv: Any, policy: bwrap.Policy, **kwargs: Any) -> int:
        seen.append(policy)  # this host has no such nodes to bind: the run gets none
        return real_run(argv, dataclasses.replace(policy, devices=[]), **kwargs)

    monkeypatch.setattr(evaluator_module.confined, "run", recorded)
    settings = Settings(_env_file=None, state_dir=tmp_path / "state", sandbox="on")  # type: ignore[call-arg]
    tree = tmp_path / "evaluator"
    tree.mkdir()
    (tree / "show.py").write_text(
        "import os\nprint('visible', os.environ['CUDA_VISIBLE_DEVICES'] or 'none')\n"
    )
    run_tree = tmp_path / "run"
    run_tree.mkdir()
    (run_tree / "model.json").write_text("{}")
    judge = Evaluator(tree, VENV, "h", "base", ["python", "show.py"], ["model.json"], None, None)
    found = evaluate(
        settings,
        1,
        judge,
        index=0,
        arm="candidate",
        run_tree=run_tree,
        device="cuda:0",
        device_env="2,1",
        time_limit_s=30,
        program=program,
    )
    # GPUs 2 and 1 and what every CUDA process needs; not GPU 0, not the DRM nodes
    assert [str(p) for p in seen[0].devices] == ["/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl"]
    log = (settings.state_dir.absolute() / "jobs" / "1" / found["log"]).read_text()
    assert "visible 1,0" in log, log
    assert seen[0].env["CUDA_VISIBLE_DEVICES"] == "1,0"
