"""A GitHub-forge world for the decision tests: the fake GitHub server (driven by the real
PyGithub client), settings that point at it, a project on its repository, cycles awaiting
review on its PRs with proposed findings, and signed webhook deliveries."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.cycles.models import Cycle, CycleStep
from app.db import Stores
from app.memory import service as memory
from app.memory.schemas import Evidence, FindingCreate
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.forge.github_fake import FakeGitHub

SECRET = "whsec-" + "k3y" * 10
TOKEN = "ghp_decisionsTokenThatMustNeverAppear012345"
PROJECT = "spectral"


def github_settings(tmp_path: Path, settings: Settings, fake: FakeGitHub, **more: Any) -> Settings:
    return settings.model_copy(
        update={
            "state_dir": tmp_path / "state",
            "forge": "github",
            "github_token": SecretStr(TOKEN),
            "github_base_url": fake.base_url,
            "github_webhook_secret": SecretStr(SECRET),
            "github_seconds_between_requests": None,
            "github_seconds_between_writes": None,
            "dashboard_url": "https://autopilot.lab/dashboard",
            **more,
        }
    )


@dataclass
class Made:
    cycle_id: int
    number: int
    finding_ids: list[str]


class World:
    def __init__(self, settings: Settings, stores: Stores, fake: FakeGitHub) -> None:
        self.settings, self.stores, self.fake = settings, stores, fake
        with stores.ops_session() as session:
            ops.create_project(
                session,
                ProjectCreate(
                    name=PROJECT,
                    repo_url=f"https://github.example/{fake.owner}/{fake.repo}.git",
                    forge="github",
                ),
            )
            self.reader = ops.create_token(session, "reader", ["trigger"])[1]

    def cycle(self, parameters: dict[str, Any] | None = None) -> Made:
        """A cycle awaiting review on a new PR, with a verdict and a lesson proposed."""
        pr = self.fake.add_pull(f"autopilot/{PROJECT}/{uuid.uuid4().hex[:8]}-probe")
        with self.stores.ops_session() as session:
            project = ops.get_project(session, PROJECT)
            cycle = Cycle(
                project_id=project.id,
                state="awaiting_review",
                experiment="probe",
                parameters=parameters or {"width": 32},
                hypothesis="Fusing the passes halves the time",
                fingerprint=uuid.uuid4().hex,
                verdict="faster",
                headline={"ratio": 0.8, "ci_low": 0.75, "ci_high": 0.86, "verdict": "faster"},
                pr_number=pr["number"],
                pr_url=pr["html_url"],
                commit_sha=pr["head"]["sha"],
            )
            session.add(cycle)
            session.flush()
            cycle_id = cycle.id
        evidence = Evidence(cycle_id=str(cycle_id), pr_url=pr["html_url"])
        with self.stores.memory_session() as msession:
            ids = [
                memory.create(
                    msession,
                    FindingCreate(
                        project=PROJECT,
                        kind=kind,
                        statement=f"{statement} (cycle {cycle_id})",
                        device_kind="cpu",
                        source=pr["html_url"],
                        source_status="verified",
                        evidence=evidence,
                    ),
                    f"cycle-{cycle_id}",
                ).id
                for kind, statement in (("verdict", "probe: faster"), ("lesson", "Fusion pays"))
            ]
        with self.stores.ops_session() as session:
            row = session.get(Cycle, cycle_id)
            assert row is not None
            row.finding_ids = ids
        return Made(cycle_id, pr["number"], ids)

    # -- what the tests read back -------------------------------------------------------------

    def state(self, cycle_id: int) -> str:
        with self.stores.ops_session() as session:
            cycle = session.get(Cycle, cycle_id)
            assert cycle is not None
            return cycle.state

    def steps(self, cycle_id: int) -> list[tuple[str, str]]:
        with self.stores.ops_session() as session:
            rows = session.query(CycleStep).filter_by(cycle_id=cycle_id).order_by(CycleStep.id)
            return [(s.name, s.detail or "") for s in rows]

    def findings(self, made: Made) -> list[tuple[str, str | None, list[tuple[str, str, str]]]]:
        """Each finding's status, who validated it, and its audit trail (to, actor, reason)."""
        out = []
        with self.stores.memory_session() as msession:
            for fid in made.finding_ids:
                finding = memory.get(msession, fid)
                trail = [
                    (e.to_status, e.actor, e.reason or "") for e in memory.history(msession, fid)
                ]
                out.append((finding.status, finding.validated_by, trail))
        return out

    def cycles(self) -> int:
        with self.stores.ops_session() as session:
            return session.query(Cycle).count()


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def deliver(
    client: TestClient,
    event: str,
    payload: dict[str, Any],
    *,
    delivery: str | None = None,
    secret: str = SECRET,
    signature: str | None = None,
) -> tuple[int, dict[str, Any], str]:
    """POST a delivery as GitHub does (compact JSON, its headers); (status, answer, id)."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    delivery = delivery or str(uuid.uuid4())
    answer = client.post(
        "/api/v1/webhooks/github",
        content=body,
        headers={
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/abc1234",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery,
            "X-GitHub-Hook-ID": "123456",
            "X-Hub-Signature-256": signature if signature is not None else sign(body, secret),
        },
    )
    return answer.status_code, answer.json(), delivery
