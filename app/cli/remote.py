"""The CLI's backend on any machine: the control host's REST API with a bearer token
(`app.cli.backend`). It reads no store and no state dir."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

from app.client import ControlClient
from app.cycles.campaigns.schemas import CampaignCreate


class RemoteBackend:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.client = ControlClient(url, token)

    def projects(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.client.get("/projects")
        return rows

    def cycles(self, project: str | None, state: str | None, limit: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.client.get(
            "/cycles", project=project, state=state, limit=limit
        )
        return rows

    def cycle(self, cycle_id: int) -> dict[str, Any]:
        row: dict[str, Any] = self.client.get(f"/cycles/{cycle_id}")
        return row

    def trigger(self, project: str, experiment: str | None, changed: str | None) -> dict[str, Any]:
        body = {"project": project, "experiment": experiment, "changed_hypothesis": changed}
        row: dict[str, Any] = self.client.post(
            "/cycles", {k: v for k, v in body.items() if v is not None}
        )
        return row

    def cancel_cycle(self, cycle_id: int) -> dict[str, Any]:
        row: dict[str, Any] = self.client.post(f"/cycles/{cycle_id}/cancel")
        return row

    def campaigns(self, project: str | None, state: str | None, limit: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.client.get(
            "/campaigns", project=project, state=state, limit=limit
        )
        return rows

    def campaign(self, campaign_id: int) -> dict[str, Any]:
        row: dict[str, Any] = self.client.get(f"/campaigns/{campaign_id}")
        return row

    def start_campaign(self, body: CampaignCreate) -> dict[str, Any]:
        # only what was given: the API's defaults stay the API's
        row: dict[str, Any] = self.client.post(
            "/campaigns", body.model_dump(mode="json", exclude_unset=True)
        )
        return row

    def stop_campaign(self, campaign_id: int) -> dict[str, Any]:
        row: dict[str, Any] = self.client.post(f"/campaigns/{campaign_id}/stop")
        return row

    def jobs(
        self, queue: str | None, state: str | None, project: str | None, limit: int
    ) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.client.get(
            "/jobs", queue=queue, state=state, project=project, limit=limit
        )
        return rows

    def job_log(self, job_id: int) -> Iterator[bytes]:
        with self.client.stream(f"/jobs/{job_id}/log") as answer:
            yield from answer.iter_bytes()

    def follow_job(
        self, job_id: int, write: Callable[[str], None], say: Callable[[str], None]
    ) -> str:
        """The API's server-sent events: `data:` lines of the log, then `event: end` with the
        job's last state."""
        say(f"following job {job_id} on {self.url}")
        event = ""
        with self.client.stream(f"/jobs/{job_id}/log", follow=1) as answer:
            for line in answer.iter_lines():
                if line.startswith("event:"):
                    event = line.removeprefix("event:").strip()
                elif line.startswith("data:"):
                    data = line.removeprefix("data:").removeprefix(" ")
                    if event == "end":
                        say(f"job {job_id} {data}")
                        return data
                    write(data + "\n")
                elif not line:
                    event = ""
        return "unknown"  # the stream ended without its end event (the API stopped)

    def search(
        self,
        query: str,
        project: str | None,
        kind: str | None,
        status: str | None,
        device_kind: str | None,
        limit: int,
    ) -> dict[str, Any]:
        page: dict[str, Any] = self.client.get(
            "/memory/findings",
            q=query,
            project=project,
            kind=kind,
            status=status,
            device_kind=device_kind,
            limit=limit,
        )
        return page

    def finding(self, finding_id: str) -> dict[str, Any]:
        row: dict[str, Any] = self.client.get(f"/memory/findings/{quote(finding_id, safe='')}")
        return row
