"""The local forge over git's smart HTTP: a real git client against the API served by uvicorn,
and the auth answers (status codes, WWW-Authenticate) through FastAPI's TestClient."""

from __future__ import annotations

import base64
import gzip
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.api.main import create_app
from app.db import Stores
from app.forge.base import ProjectRef
from app.forge.local import LocalForge
from app.git import ls_refs, mirror
from app.git.exceptions import InvalidRef
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.forge.gitrepo import commit_to, git, make_origin
from tests.support import bearer, served
from workers import prepare

BRANCH = "autopilot/spectral/c0ffee01-fuse"
REFS = "/git/spectral.git/info/refs?service=git-upload-pack"


@dataclass
class Forge:
    project: ProjectRef
    bare: Path
    branch_sha: str
    main_sha: str
    tokens: dict[str, str]


@pytest.fixture
def forge(settings: Settings, stores: Stores, tmp_path: Path) -> Forge:
    """Project `spectral` on the local forge, with a branch holding a commit of its own, and a
    token of each scope (one revoked)."""
    origin = make_origin(tmp_path)
    project = ProjectRef("spectral", str(origin), "main")
    local = LocalForge(settings, stores)
    bare = Path(local.remote_url(project))
    git(bare, "branch", BRANCH, "main")
    branch_sha = commit_to(bare, tmp_path, BRANCH, "src/kernel.py", "def kernel(x):\n    x + x\n")
    tokens: dict[str, str] = {}
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="spectral", repo_url=str(origin)))
        ops.create_project(session, ProjectCreate(name="no-repo-yet", repo_url=str(origin)))
        for scope in ("worker", "trigger", "review", "admin"):
            tokens[scope] = ops.create_token(session, f"t-{scope}", [scope])[1]
        tokens["revoked"] = ops.create_token(session, "t-revoked", ["worker"])[1]
        ops.revoke_token(session, "t-revoked")
    return Forge(project, bare, branch_sha, git(bare, "rev-parse", "main"), tokens)


@pytest.fixture
def server(settings: Settings, stores: Stores) -> Iterator[str]:
    """The API served by uvicorn in a thread on 127.0.0.1:<free port>; yields its base URL."""
    with served(create_app(settings, stores)) as url:
        yield url


def git_client(cwd: Path, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    """A real git client that never prompts and reads no user or system config."""
    config = ["-c", f"http.extraHeader=Authorization: Bearer {token}"] if token else []
    env = {
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "Worker",
        "GIT_AUTHOR_EMAIL": "worker@gpu.example",
        "GIT_COMMITTER_NAME": "Worker",
        "GIT_COMMITTER_EMAIL": "worker@gpu.example",
    }
    return subprocess.run(  # noqa: S603
        ["git", *config, *args],  # noqa: S607
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# -- a real git client against the API on a real port -------------------------------------------


def test_worker_clones_and_fetches_the_branch(
    forge: Forge, server: str, settings: Settings, stores: Stores, tmp_path: Path
) -> None:
    url = LocalForge(settings, stores).http_url(forge.project, server)
    assert url == f"{server}/git/spectral.git"
    clone = tmp_path / "gpu-host"
    done = git_client(
        tmp_path, "clone", "-q", "-b", BRANCH, url, str(clone), token=forge.tokens["worker"]
    )
    assert done.returncode == 0, done.stderr
    assert git(clone, "rev-parse", "HEAD") == forge.branch_sha
    assert (clone / "src/kernel.py").read_text() == "def kernel(x):\n    x + x\n"

    # A new commit on the branch arrives by fetch; v0 and v2 of the protocol both work.
    newer = commit_to(forge.bare, tmp_path, BRANCH, "src/extra.py", "X = 1\n")
    for version in ("0", "2"):
        done = git_client(
            clone, "-c", f"protocol.version={version}", "fetch", "-q", "origin", BRANCH,
            token=forge.tokens["worker"],
        )  # fmt: skip
        assert done.returncode == 0, (version, done.stderr)
        assert git(clone, "rev-parse", "FETCH_HEAD") == newer


def test_token_as_basic_password_from_a_credential_helper(
    forge: Forge, server: str, tmp_path: Path
) -> None:
    helper = f"!f() {{ echo username=gpu-1; echo password={forge.tokens['admin']}; }}; f"
    done = git_client(
        tmp_path, "-c", f"credential.helper={helper}", "ls-remote", f"{server}/git/spectral.git"
    )
    assert done.returncode == 0, done.stderr
    assert f"{forge.branch_sha}\trefs/heads/{BRANCH}" in done.stdout.splitlines()


@pytest.mark.parametrize(
    ("who", "path", "status", "message"),
    [
        (None, "spectral", 401, "could not read Username"),
        ("revoked", "spectral", 401, "could not read Username"),
        ("garbage", "spectral", 401, "could not read Username"),
        ("trigger", "spectral", 403, "403"),
        ("review", "spectral", 403, "403"),
        ("worker", "unknown", 404, "not found"),
        ("worker", "no-repo-yet", 404, "not found"),
    ],
)
def test_refused_fetches(
    forge: Forge, server: str, tmp_path: Path, who: str | None, path: str, status: int, message: str
) -> None:
    token = {None: None, "garbage": "ap_not-a-token"}.get(who, forge.tokens.get(who or ""))
    url = f"{server}/git/{path}.git"
    done = git_client(tmp_path, "clone", "-q", url, str(tmp_path / "c"), token=token)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()
    headers = bearer(token) if token else {}
    answer = httpx.get(f"{url}/info/refs?service=git-upload-pack", headers=headers)
    assert answer.status_code == status


def test_push_is_refused(forge: Forge, server: str, tmp_path: Path) -> None:
    clone = tmp_path / "gpu-host"
    url = f"{server}/git/spectral.git"
    admin = forge.tokens["admin"]
    assert git_client(tmp_path, "clone", "-q", url, str(clone), token=admin).returncode == 0
    (clone / "evil.py").write_text("print('pwned')\n")
    git_client(clone, "add", "-A")
    assert git_client(clone, "commit", "-q", "-m", "evil").returncode == 0
    done = git_client(clone, "push", "origin", "HEAD:refs/heads/evil", token=admin)
    assert done.returncode != 0
    assert "403" in done.stderr, done.stderr
    assert git(forge.bare, "branch", "--list", "evil") == ""
    assert git(forge.bare, "rev-parse", "main") == forge.main_sha


# -- the answers, status by status (TestClient) --------------------------------------------------


@pytest.fixture
def client(settings: Settings, stores: Stores) -> Iterator[TestClient]:
    with TestClient(create_app(settings, stores)) as client:
        yield client


def basic(token: str, user: str = "anyone") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()}


def test_no_token_asks_for_basic_credentials(forge: Forge, client: TestClient) -> None:
    response = client.get(REFS)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Basic realm="autopilot"'
    assert response.headers["content-type"] == "application/problem+json"
    # The REST API still challenges for a bearer token.
    assert client.get("/api/v1/projects").headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer ap_not-a-token"},
        {"Authorization": "Basic !!!not-base64"},
        {"Authorization": "Basic " + base64.b64encode(b"no-colon").decode()},
        {"Authorization": "Digest abc"},
    ],
)
def test_invalid_credentials_are_401(
    forge: Forge, client: TestClient, headers: dict[str, str]
) -> None:
    response = client.get(REFS, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Basic realm="autopilot"'


def test_revoked_is_401_and_wrong_scope_403(forge: Forge, client: TestClient) -> None:
    for header in (bearer, basic):
        assert client.get(REFS, headers=header(forge.tokens["revoked"])).status_code == 401
        for scope in ("trigger", "review"):
            response = client.get(REFS, headers=header(forge.tokens[scope]))
            assert response.status_code == 403
            assert "worker" in response.json()["detail"]
        for scope in ("worker", "admin"):
            response = client.get(REFS, headers=header(forge.tokens[scope]))
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == (
                "application/x-git-upload-pack-advertisement"
            )
            assert f"{forge.branch_sha} refs/heads/{BRANCH}".encode() in response.content


def test_worker_token_reads_nothing_else(forge: Forge, client: TestClient) -> None:
    worker = bearer(forge.tokens["worker"])
    for path in ("/api/v1/projects", "/api/v1/cycles", "/api/v1/memory/findings"):
        response = client.get(path, headers=worker)
        assert response.status_code == 403, path
    response = client.post("/api/v1/cycles", headers=worker, json={"project": "spectral"})
    assert response.status_code == 403


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/git/spectral.git/info/refs?service=git-receive-pack", 403),
        ("POST", "/git/spectral.git/git-receive-pack", 403),
        ("GET", "/git/spectral.git/info/refs", 404),  # the dumb protocol
        ("GET", "/git/spectral.git/HEAD", 404),
        ("GET", "/git/spectral.git/objects/info/packs", 404),
        ("GET", "/git/spectral.git/git-upload-pack", 404),
        ("PUT", "/git/spectral.git/git-upload-pack", 404),
        ("GET", "/git/..git/info/refs?service=git-upload-pack", 404),
        ("GET", "/git/%2e%2e.git/info/refs?service=git-upload-pack", 404),
        ("GET", "/git/.hidden.git/info/refs?service=git-upload-pack", 404),
        ("GET", "/git/Spectral.git/info/refs?service=git-upload-pack", 404),
        ("GET", "/git/a%2F..%2Fspectral.git/info/refs?service=git-upload-pack", 404),
        ("GET", "/git/spectral/info/refs?service=git-upload-pack", 404),
    ],
)
def test_only_the_fetch_side_is_served(
    forge: Forge, client: TestClient, method: str, path: str, status: int
) -> None:
    response = client.request(method, path, headers=bearer(forge.tokens["admin"]))
    assert response.status_code == status, response.text


def upload_pack_request(*wants: str) -> bytes:
    def pkt(line: str) -> bytes:
        return f"{len(line) + 4:04x}{line}".encode()

    first, *more = wants
    lines = [pkt(f"want {first} no-progress\n"), *(pkt(f"want {w}\n") for w in more)]
    return b"".join([*lines, b"0000", pkt("done\n")])


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_upload_pack_answers_a_pack_gzipped_or_not(
    forge: Forge, client: TestClient, encoding: str | None
) -> None:
    body = upload_pack_request(forge.branch_sha, forge.main_sha)
    headers = {
        **bearer(forge.tokens["worker"]),
        "Content-Type": "application/x-git-upload-pack-request",
    }
    if encoding:
        body = gzip.compress(body)
        headers["Content-Encoding"] = encoding
    response = client.post("/git/spectral.git/git-upload-pack", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-git-upload-pack-result"
    assert response.content.startswith(b"0008NAK\n")
    assert b"PACK" in response.content[:64]


def test_a_branch_tip_is_one_ls_refs_request(forge: Forge, server: str) -> None:
    """What a GPU host asks before a job whose commit it holds (`app/git/ls_refs.py`)."""
    url = f"{server}/git/spectral.git"
    worker = bearer(forge.tokens["worker"])
    with httpx.Client() as client:
        assert ls_refs.branch_tip(client, url, BRANCH, worker) == forge.branch_sha
        assert ls_refs.branch_tip(client, url, "main", worker) == forge.main_sha
        assert ls_refs.branch_tip(client, url, "autopilot/spectral", worker) is None  # a prefix
        assert ls_refs.branch_tip(client, url, "no-such-branch", worker) is None
        with pytest.raises(ls_refs.TipUnknown, match="HTTP 401"):
            ls_refs.branch_tip(client, url, "main", {})
        with pytest.raises(ls_refs.TipUnknown, match="HTTP 403"):
            ls_refs.branch_tip(client, url, "main", bearer(forge.tokens["trigger"]))
        with pytest.raises(ls_refs.TipUnknown, match="HTTP 404"):
            ls_refs.branch_tip(client, f"{server}/git/nothing.git", "main", worker)


def test_a_gpu_host_fetches_a_held_commit_only_when_its_branch_moved(
    forge: Forge, server: str, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=tmp_path / "gpu-host",
        control_url=server,
        control_token=SecretStr(forge.tokens["worker"]),
    )
    source = prepare._Source(
        project="spectral",
        repo=f"{server}/git/spectral.git",
        ref=BRANCH,
        head_sha=forge.branch_sha,
        experiment="probe",
        queue="gpu.cpu",
    )
    first = prepare.export(host, 1, source)
    fetches: list[str] = []
    fetch_commit = mirror.fetch_commit

    def counted(*args: object, **kwargs: object) -> tuple[Path, str]:
        fetches.append("fetch")
        return fetch_commit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mirror, "fetch_commit", counted)
    second = prepare.export(host, 2, source)
    assert fetches == []  # held, and still the branch's tip: one ls-refs request, no fetch
    assert (second / "src" / "kernel.py").read_text() == (first / "src" / "kernel.py").read_text()
    # The branch is rewritten on the forge: the held commit is no longer on it, and the job
    # is refused as before (the fetch's own check).
    git(forge.bare, "update-ref", f"refs/heads/{BRANCH}", forge.main_sha)
    with pytest.raises(InvalidRef, match="is no longer on branch"):
        prepare.export(host, 3, source)
    assert fetches == ["fetch"]
