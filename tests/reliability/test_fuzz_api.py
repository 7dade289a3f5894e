"""Schemathesis against /openapi.json, in process, with a valid admin token.

Every operation gets up to 50 generated requests; no answer may be a 5xx, and every answer
must conform to the document: a documented status code, its content type and its schema.
Runs on PostgreSQL when it is configured (stricter than SQLite about what it stores).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app import migrate
from app.api.main import create_app
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.conftest import POSTGRES_URL, _postgres_admin_engine
from tests.integration.queue.conftest import make_repo
from tests.support import bearer

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed")
from schemathesis import checks  # noqa: E402 - only once schemathesis is known to be there

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.stores("sqlite", "postgres"),
    pytest.mark.timeout(120),
]

MAX_EXAMPLES = 50
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One migrated pair of stores for the whole module, an admin token and a project."""
    root = tmp_path_factory.mktemp("fuzz")
    names: list[str] = []
    if POSTGRES_URL:
        base = make_url(POSTGRES_URL)
        suffix = uuid.uuid4().hex[:10]
        names = [f"ap_fuzz_memory_{suffix}", f"ap_fuzz_ops_{suffix}"]
        admin = _postgres_admin_engine()
        with admin.connect() as connection:
            for name in names:
                connection.execute(text(f'CREATE DATABASE "{name}"'))
        urls = [base.set(database=n).render_as_string(hide_password=False) for n in names]
    else:
        urls = [f"sqlite:///{root / 'memory.db'}", f"sqlite:///{root / 'ops.db'}"]
    app_settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=root / "state",
        memory_url=urls[0],
        ops_url=urls[1],
        # With a secret the webhook is live: generated deliveries meet the signature check
        # (401) rather than the 503 of a service that has no webhook configured.
        github_webhook_secret="fuzz-webhook-secret",
    )
    migrate.upgrade(app_settings)
    stores = Stores.from_settings(app_settings)
    repo = make_repo(Path(root), "fuzz-probe")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "fuzz-admin", ["admin"])
    try:
        yield {"app": create_app(app_settings, stores), "token": token}
    finally:
        stores.dispose()
        if names:
            with admin.connect() as connection:
                for name in names:
                    connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


def _operation_labels() -> list[str]:
    """The operations of the document, read at collection from an app on throwaway stores."""
    app = create_app(
        Settings(_env_file=None, memory_url="sqlite://", ops_url="sqlite://")  # type: ignore[call-arg]
    )
    return [
        f"{method.upper()} {path}"
        for path, item in app.openapi()["paths"].items()
        for method in item
    ]


@pytest.fixture(scope="module")
def operations(fuzz_target: dict[str, Any]) -> dict[str, Any]:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_target["app"])
    found = [result.ok() for result in schema.get_all_operations()]
    return {op.label: op for op in found}


@pytest.mark.parametrize("label", _operation_labels())
def test_api_conforms_and_never_5xx(
    label: str, operations: dict[str, Any], fuzz_target: dict[str, Any]
) -> None:
    headers = bearer(fuzz_target["token"])

    @given(case=operations[label].as_strategy())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,  # the same examples on every run: a failure reproduces
        database=None,
    )
    def run(case: Any) -> None:
        case.call_and_validate(headers=headers, checks=CHECKS)

    run()
