"""Projects over REST: create, list, get, delete, and bad input as problem+json."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.support import bearer


def test_project_lifecycle(client: TestClient, tokens: dict[str, str]) -> None:
    admin = bearer(tokens["admin"])
    body = {"name": "spectral-operator-compiler", "repo_url": "/srv/repos/soc"}
    created = client.post("/api/v1/projects", json=body, headers=admin)
    assert created.status_code == 201, created.text
    assert created.json()["default_branch"] == "main"

    listed = client.get("/api/v1/projects", headers=bearer(tokens["review"]))
    assert [p["name"] for p in listed.json()] == ["spectral-operator-compiler"]
    got = client.get("/api/v1/projects/spectral-operator-compiler", headers=admin)
    assert got.json()["repo_url"] == "/srv/repos/soc"

    assert (
        client.delete("/api/v1/projects/spectral-operator-compiler", headers=admin).status_code
        == 204
    )
    missing = client.get("/api/v1/projects/spectral-operator-compiler", headers=admin)
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["type"].endswith("/project-not-found")


def test_duplicate_project_is_409_and_keeps_the_first(
    client: TestClient, tokens: dict[str, str]
) -> None:
    admin = bearer(tokens["admin"])
    client.post("/api/v1/projects", json={"name": "lora", "repo_url": "/a"}, headers=admin)
    again = client.post("/api/v1/projects", json={"name": "lora", "repo_url": "/b"}, headers=admin)
    assert again.status_code == 409
    assert again.headers["content-type"] == "application/problem+json"
    assert "already exists" in again.json()["detail"]
    assert client.get("/api/v1/projects/lora", headers=admin).json()["repo_url"] == "/a"


def test_bad_names_and_urls_are_422_naming_the_field(
    client: TestClient, tokens: dict[str, str]
) -> None:
    admin = bearer(tokens["admin"])
    for body, field in [
        ({"name": "Not A Slug", "repo_url": "/a"}, "name"),
        ({"name": "-dash", "repo_url": "/a"}, "name"),
        ({"name": "ok", "repo_url": "ext::sh -c touch% /tmp/pwned"}, "repo_url"),
        ({"name": "ok", "repo_url": "--upload-pack=evil"}, "repo_url"),
        ({"name": "ok", "repo_url": "/a", "default_branch": "a..b"}, "default_branch"),
        ({"name": "ok", "repo_url": "/a", "surprise": 1}, "surprise"),
    ]:
        response = client.post("/api/v1/projects", json=body, headers=admin)
        assert response.status_code == 422, body
        problem = response.json()
        assert response.headers["content-type"] == "application/problem+json"
        assert problem["errors"][0]["field"] == field
    assert client.get("/api/v1/projects", headers=admin).json() == []


def test_health_and_ready(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"memory": "ok", "ops": "ok", "broker": "ok"}


def test_oversized_body_is_413(client: TestClient, tokens: dict[str, str]) -> None:
    limit = client.app.state.settings.max_request_bytes  # type: ignore[attr-defined]
    response = client.post(
        "/api/v1/projects",
        content=b"{" + b" " * (limit + 1) + b"}",
        headers={**bearer(tokens["admin"]), "Content-Type": "application/json"},
    )
    assert response.status_code == 413
    assert response.headers["content-type"] == "application/problem+json"


def test_a_token_as_the_whole_userinfo_is_refused(
    client: TestClient, tokens: dict[str, str]
) -> None:
    admin = bearer(tokens["admin"])
    for url in ("https://ghp_x@github.com/o/r", "https://ghp_x:x-oauth-basic@github.com/o/r"):
        response = client.post(
            "/api/v1/projects", json={"name": "lab", "repo_url": url}, headers=admin
        )
        assert response.status_code == 422, url
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["errors"][0]["field"] == "repo_url"
        assert "credentials" in response.text
        assert "ghp_x" not in response.text  # the refused URL is not echoed back
    assert client.get("/api/v1/projects", headers=admin).json() == []


def test_an_ssh_login_name_is_not_a_credential(client: TestClient, tokens: dict[str, str]) -> None:
    admin = bearer(tokens["admin"])
    for name, url in [
        ("ssh-url", "ssh://git@github.com/o/r.git"),
        ("scp-like", "git@github.com:o/r.git"),
    ]:
        response = client.post(
            "/api/v1/projects", json={"name": name, "repo_url": url}, headers=admin
        )
        assert response.status_code == 201, response.text
        assert response.json()["repo_url"] == url
