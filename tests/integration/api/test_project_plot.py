"""`GET /api/v1/projects/{name}/plot`: a project's trend and parameter maps as SVG, and its errors
as problem+json naming what was wrong."""

from __future__ import annotations

import re
from xml.etree import ElementTree

from fastapi.testclient import TestClient

from app.cycles import service as cycles
from app.cycles.headline import headline
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.support import bearer

SVG_NS = "{http://www.w3.org/2000/svg}"


def _project(stores: Stores, name: str = "tiles") -> None:
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=name, repo_url=f"/srv/{name}"))


def _judged(
    stores: Stores,
    experiment: str,
    parameters: dict[str, object],
    verdict: str | None,
    ratio: float | None,
    project: str = "tiles",
) -> int:
    """A cycle made by the service, then given the verdict and headline the analyze step
    stores (`headline` of a judged result)."""
    with stores.ops_session() as session:
        cycle, _ = cycles.create(
            session,
            cycles.Trigger(project=project, experiment=experiment, parameters=parameters),
        )
        if verdict is not None and ratio is not None:
            cycle.state, cycle.verdict = "awaiting_review", verdict
            cycle.headline = headline(
                {
                    "verdict": verdict,
                    "ratio": ratio,
                    "ci_low": ratio - 0.03,
                    "ci_high": ratio + 0.03,
                }
            )
        else:
            cycle.state = "failed"
        session.flush()
        return cycle.id


def test_trend_and_space_are_svg_with_a_link_per_cycle(
    client: TestClient, tokens: dict[str, str], stores: Stores
) -> None:
    _project(stores)
    ids = [
        _judged(stores, "tile", {"block": 16, "unroll": 1}, "slower", 1.2),
        _judged(stores, "tile", {"block": 32, "unroll": 1}, "faster", 0.9),
        _judged(stores, "tile", {"block": 64, "unroll": 2}, "faster", 0.8),
        _judged(stores, "tile", {"block": 64, "unroll": 4}, None, None),
    ]
    reader = bearer(tokens["trigger"])
    trend = client.get("/api/v1/projects/tiles/plot", headers=reader)
    assert trend.status_code == 200, trend.text
    assert trend.headers["content-type"].startswith("image/svg+xml")
    assert trend.headers["content-security-policy"] == "default-src 'none'"
    root = ElementTree.fromstring(trend.content)
    assert root.tag == f"{SVG_NS}svg"
    links = set(re.findall(r'<a href="(/dashboard/cycles/\d+)"', trend.text))
    assert links == {f"/dashboard/cycles/{i}" for i in ids[:3]}  # the failed one has no ratio
    assert f"best tile: cycle {ids[2]}, 0.800" in trend.text

    space = client.get(
        "/api/v1/projects/tiles/plot",
        params={"kind": "space", "experiment": "tile"},
        headers=reader,
    )
    assert space.status_code == 200, space.text
    ElementTree.fromstring(space.content)
    links = set(re.findall(r'<a href="(/dashboard/cycles/\d+)"', space.text))
    assert links == {f"/dashboard/cycles/{i}" for i in ids}  # not judged: still on the map
    assert "Parameter space of tile" in space.text


def test_errors_name_what_was_wrong(
    client: TestClient, tokens: dict[str, str], stores: Stores
) -> None:
    reader = bearer(tokens["review"])
    unknown = client.get("/api/v1/projects/nope/plot", headers=reader)
    assert unknown.status_code == 404
    assert unknown.headers["content-type"] == "application/problem+json"
    assert unknown.json()["type"].endswith("/project-not-found")
    assert "no project named 'nope'" in unknown.json()["detail"]

    _project(stores)
    empty = client.get("/api/v1/projects/tiles/plot", headers=reader)
    assert empty.status_code == 404 and empty.json()["type"].endswith("/nothing-to-plot")
    assert "has no cycles yet" in empty.json()["detail"]

    bad = client.get("/api/v1/projects/tiles/plot", params={"kind": "pie"}, headers=reader)
    assert bad.status_code == 422
    assert bad.headers["content-type"] == "application/problem+json"
    assert "kind" in bad.json()["detail"] and "'trend' or 'space'" in bad.json()["detail"]

    _judged(stores, "tile", {"block": 16}, "faster", 0.9)
    _judged(stores, "warp", {"warps": 4}, "slower", 1.1)
    which = client.get("/api/v1/projects/tiles/plot", params={"kind": "space"}, headers=reader)
    assert which.status_code == 422
    assert "tile, warp" in which.json()["detail"] and which.json()["field"] == "experiment"
    other = client.get(
        "/api/v1/projects/tiles/plot", params={"kind": "space", "experiment": "x"}, headers=reader
    )
    assert other.status_code == 404 and "no cycle of experiment 'x'" in other.json()["detail"]


def test_the_plot_needs_a_reading_token(client: TestClient, tokens: dict[str, str]) -> None:
    assert client.get("/api/v1/projects/tiles/plot").status_code == 401
    worker_only = client.get("/api/v1/projects/tiles/plot", headers=bearer(tokens["worker"]))
    assert worker_only.status_code == 403


def test_openapi_documents_the_plot(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/api/v1/projects/{name}/plot"]["get"]
    assert operation["operationId"] == "getProjectPlot"
    assert "image/svg+xml" in operation["responses"]["200"]["content"]
    assert {"404", "422"} <= set(operation["responses"])
    kinds = next(p for p in operation["parameters"] if p["name"] == "kind")
    assert kinds["schema"]["enum"] == ["trend", "space"]
