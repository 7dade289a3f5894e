"""An API client over real, migrated stores, and tokens of each scope."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.projects import service as ops
from app.settings import Settings


@pytest.fixture
def client(settings: Settings, stores: Stores) -> Iterator[TestClient]:
    with TestClient(create_app(settings, stores)) as client:
        yield client


@pytest.fixture
def tokens(stores: Stores) -> dict[str, str]:
    """A live token per scope (worker: forge reads only), and a revoked one."""
    made: dict[str, str] = {}
    with stores.ops_session() as session:
        for scope in ("trigger", "review", "admin", "worker"):
            made[scope] = ops.create_token(session, f"t-{scope}", [scope])[1]
        made["revoked"] = ops.create_token(session, "t-revoked", ["admin"])[1]
        ops.revoke_token(session, "t-revoked")
    return made
