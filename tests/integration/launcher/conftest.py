"""Real venvs, real runtime dirs and real experiment processes for the launcher tests."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.launcher.launch import LaunchSpec
from workers.launcher.runtime import RuntimeDir, allocate_runtime, release_runtime
from workers.launcher.venv import Venv, ensure_venv


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="session")
def venv(state_dir: Path) -> Venv:
    """One real venv for the session (built once; system site packages keep it small)."""
    return ensure_venv(state_dir, "fixture", [], system_site_packages=True)


@pytest.fixture
def runtime_dir(state_dir: Path) -> Iterator[RuntimeDir]:
    rt = allocate_runtime(state_dir=state_dir, env=os.environ)
    yield rt
    release_runtime(rt)


MakeJob = Callable[..., LaunchSpec]


@pytest.fixture
def make_job(tmp_path: Path, venv: Venv, runtime_dir: RuntimeDir) -> MakeJob:
    """A job whose entry module `exp` in a fresh worktree runs `body` (dedented)."""

    def make(body: str, **kw: Any) -> LaunchSpec:
        worktree = tmp_path / "wt"
        worktree.mkdir(exist_ok=True)
        (worktree / "exp.py").write_text(textwrap.dedent(body))
        args: dict[str, Any] = {
            "venv": venv.path,
            "entry": "exp",
            "cwd": worktree,
            "runtime": runtime_dir,
            "spec": {"params": {"n": 1}},
            "pythonpath": [worktree],
            "base_env": dict(os.environ),
            "cuda_visible_devices": "",
        }
        args.update(kw)
        return LaunchSpec(**args)

    return make
