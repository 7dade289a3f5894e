"""docker-compose.yml, deploy/Dockerfile and .env.example: valid, complete and safe, checked
without a Docker engine (the Compose specification's JSON schema ships with check-jsonschema)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from app.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
REQUIRED = {"postgres", "redis", "migrate", "api", "worker-control", "worker-gpu", "beat", "flower"}
ONE_SHOT = {"migrate"}


@cache
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return loaded


def compose_schema() -> dict[str, Any]:
    path = resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return schema


def test_check_jsonschema_validates_the_compose_file() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_catches_mistakes() -> None:
    """The same schema, through jsonschema: the file passes, a broken copy does not."""
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert list(validator.iter_errors(compose())) == []
    broken = copy.deepcopy(compose())
    broken["services"]["api"]["healthchek"] = broken["services"]["api"].pop("healthcheck")
    broken["servics"] = {}
    assert len(list(validator.iter_errors(broken))) >= 2


def test_every_required_service_exists() -> None:
    assert set(compose()["services"]) >= REQUIRED


def test_redis_keeps_its_messages() -> None:
    command = compose()["services"]["redis"]["command"]
    text = " ".join(command) if isinstance(command, list) else command
    assert re.search(r"--appendonly\s+yes", text)
    assert re.search(r"--maxmemory-policy\s+noeviction", text)
    volumes = compose()["services"]["redis"]["volumes"]
    assert any(str(v).endswith(":/data") for v in volumes), "the AOF must live on a volume"


def test_worker_gpu_reserves_an_nvidia_device() -> None:
    devices = compose()["services"]["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
    command = compose()["services"]["worker-gpu"]["command"]
    assert command[:3] == ["autopilot", "worker", "gpu"]
    assert "--kind" in command and "--device" in command


def test_commands() -> None:
    services = compose()["services"]
    assert services["migrate"]["command"] == ["autopilot", "db", "upgrade"]
    assert services["api"]["command"][:2] == ["autopilot", "serve"]
    assert "0.0.0.0" in services["api"]["command"]
    assert services["worker-control"]["command"] == ["autopilot", "worker", "control"]
    assert services["beat"]["command"] == ["autopilot", "beat"]
    assert "flower" in services["flower"]["command"]


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in compose()["services"].items():
        if name in ONE_SHOT:
            continue
        check = service.get("healthcheck")
        assert check and check.get("test") and not check.get("disable"), name
        assert service.get("restart") in {"always", "unless-stopped"}, name


def test_services_using_the_databases_wait_for_the_migration() -> None:
    for name, service in compose()["services"].items():
        if service.get("command", [""])[0] != "autopilot" or name in ONE_SHOT:
            continue
        depends = service.get("depends_on", {})
        assert depends.get("migrate") == {"condition": "service_completed_successfully"}, name
    assert compose()["services"]["migrate"]["restart"] == "no"


def test_state_and_databases_are_on_named_volumes() -> None:
    services = compose()["services"]
    named = set(compose()["volumes"])
    for name in ("api", "worker-control", "worker-gpu", "beat", "postgres", "redis"):
        sources = {str(v).split(":")[0] for v in services[name]["volumes"]}
        assert sources & named, f"{name} keeps its state on no named volume"
    for name in ("api", "worker-control", "worker-gpu", "beat"):
        assert "autopilot-state:/var/lib/autopilot" in services[name]["volumes"], name
        assert services[name]["env_file"] == ".env", name


def test_ports_are_local_unless_configured() -> None:
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("${"), f"{name} publishes {port} on every interface"


def variables_used(text: str) -> set[str]:
    # ${VAR}, ${VAR:-default}, ${VAR:?error}; $$ escapes one for the container's shell.
    return set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def env_example_names() -> set[str]:
    names = set()
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^#?\s*([A-Z][A-Z0-9_]*)=", line)
        if match:
            names.add(match.group(1))
    return names


def test_every_compose_variable_is_in_env_example() -> None:
    used = variables_used(COMPOSE.read_text(encoding="utf-8"))
    assert {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "AUTOPILOT_GPU_KIND"} <= used
    assert used - env_example_names() == set()


def test_every_setting_is_in_env_example() -> None:
    wanted = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    assert wanted - env_example_names() == set()


def test_env_example_is_valid_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in list(__import__("os").environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    settings = Settings(_env_file=str(ENV_EXAMPLE))  # type: ignore[call-arg]
    assert settings.memory_database_url.startswith("postgresql")
    assert settings.ops_database_url.startswith("postgresql")
    assert settings.memory_database_url != settings.ops_database_url
    assert settings.broker_url.startswith("redis://")
    assert settings.gpu_kinds and settings.cors_origins == []


def final_stage(dockerfile: str) -> list[str]:
    lines = [line.strip() for line in dockerfile.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")]
    assert len(starts) >= 2, "the Dockerfile is not multi-stage"
    return lines[starts[-1] :]


def test_dockerfile_final_stage_runs_as_a_user() -> None:
    stage = final_stage(DOCKERFILE.read_text(encoding="utf-8"))
    users = [line.split(None, 1)[1] for line in stage if line.upper().startswith("USER ")]
    assert users, "the final stage has no USER line: it would run as root"
    assert users[-1].split(":")[0] not in {"root", "0"}


def test_dockerfile_keeps_migrations_and_harness_where_the_code_looks() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    stage = "\n".join(final_stage(text))
    assert "COPY migrations" in stage and "COPY experiments" in stage
    assert "PYTHONPATH=/srv/autopilot" in stage
    assert re.search(r"flower==\d+\.\d+\.\d+", text), "flower must be pinned"
    assert "pip install -e" not in text


def test_dockerfile_final_stage_has_the_sandbox() -> None:
    """The image runs GPU workers too (deploy/kubernetes): without bubblewrap their start checks
    refuse to start, and no untrusted code may run unconfined by default."""
    stage = "\n".join(final_stage(DOCKERFILE.read_text(encoding="utf-8")))
    installs = [line for line in stage.splitlines() if "apt-get install" in line]
    assert any(re.search(r"\bbubblewrap\b", line) for line in installs), installs


def test_dockerignore_keeps_secrets_out_of_the_image() -> None:
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert ".env" in ignored and ".venv" in ignored and ".git" in ignored
