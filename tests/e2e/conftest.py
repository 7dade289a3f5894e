"""End-to-end fixtures: the real workers of the queue tests, the API + dashboard served by
uvicorn on a free local port, and Debian's Chromium driven by Playwright.

The browser suite runs on the embedded stack only (SQLite + the filesystem broker): what it
tests is the page flow, which the store back end does not change.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.db import Stores
from app.settings import Settings
from tests.conftest import REQUIRE_SERVICES, Backend

# Fixtures are imported explicitly (pytest_plugins is only allowed in the root conftest).
from tests.integration.queue.conftest import (  # noqa: F401 - fixtures used by name
    queue_settings,
    shared_venv_root,
    workers,
)
from tests.support import served

CHROMIUM = Path(os.environ.get("AUTOPILOT_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


@pytest.fixture
def backend(tmp_path: Path) -> Backend:
    return Backend(
        "sqlite", f"sqlite:///{tmp_path / 'memory.db'}", f"sqlite:///{tmp_path / 'ops.db'}"
    )


@pytest.fixture
def broker_url() -> str:
    return "filesystem://"


def _unavailable(reason: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(f"{reason} (AUTOPILOT_TEST_REQUIRE_SERVICES=1: the browser tests must run)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright; no browser download)")
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing: apt-get install -y chromium chromium-driver")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@dataclass
class LiveServer:
    url: str
    settings: Settings
    stores: Stores


@pytest.fixture
def live_server(queue_settings: Settings, stores: Stores) -> Iterator[LiveServer]:  # noqa: F811
    """The API with the dashboard, served by uvicorn in a thread on 127.0.0.1:<free port>."""
    from app.api.main import create_app

    with served(create_app(queue_settings, stores)) as url:
        yield LiveServer(url, queue_settings, stores)


@pytest.fixture
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
