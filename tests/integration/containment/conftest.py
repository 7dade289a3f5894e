"""Hostile-agent and hostile-experiment fixtures: the sandbox really on (for the workers too),
a canary secret in the service's environment, and a state dir outside /tmp (inside a sandbox
/tmp is a private tmpfs, so a path under it would hide a write that reached the host's real
path); the launcher's real venv and runtime dirs for experiments run through the runner."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.sandbox import confined
from app.settings import Settings
from tests.conftest import REQUIRE_SERVICES, Backend
from tests.integration.launcher.conftest import (  # noqa: F401 - fixtures used here too
    runtime_dir,
    state_dir,
    venv,
)
from tests.integration.queue.conftest import (  # noqa: F401 - fixtures used here too
    queue_settings,
    shared_venv_root,
    workers,
)


@pytest.fixture
def broker_url(backend: Backend) -> str:
    """The containment suite is slow (whole sandboxed cycles) and what it tests does not depend
    on the stores or the broker: it runs once, on the embedded ones, not per back end."""
    if backend.name != "sqlite":
        pytest.skip("the containment suite runs once, with the embedded stores and broker")
    return "filesystem://"


@pytest.fixture(autouse=True)
def sandbox_on() -> None:
    reason = confined.check()
    if reason and not REQUIRE_SERVICES:
        pytest.skip(f"the sandbox is not available here: {reason}")
    assert reason is None, reason


@pytest.fixture
def queue_sandbox() -> str:
    """The real workers started here run sandboxed: agents and experiments alike."""
    return "on"


@pytest.fixture
def outside() -> Iterator[Path]:
    """A host directory outside /tmp, removed afterwards."""
    root = Path("/var/tmp") / f"autopilot-hostile-{uuid.uuid4().hex[:12]}"  # noqa: S108
    root.mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def settings(backend: Backend, outside: Path) -> Settings:
    """The state dir (and the SQLite stores, as by default) under `outside`."""
    state = outside / "state"
    update = {}
    if backend.name == "sqlite":
        update = {
            "memory_url": f"sqlite:///{state / 'memory.db'}",
            "ops_url": f"sqlite:///{state / 'ops.db'}",
        }
    state.mkdir()
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=state,
        memory_url=update.get("memory_url", backend.memory_url),
        ops_url=update.get("ops_url", backend.ops_url),
    )


@pytest.fixture
def canary() -> str:
    return f"CANARY-{uuid.uuid4().hex}"


def canary_env(canary: str) -> dict[str, str]:
    """What the worker processes get on top of their settings: the canary as the GitHub token,
    as a service variable and as a plain variable."""
    return {
        "AUTOPILOT_GITHUB_TOKEN": canary,
        "AUTOPILOT_CANARY_SECRET": canary,
        "HOSTILE_CANARY": canary,
    }
