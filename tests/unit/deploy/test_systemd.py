"""deploy/systemd units and the GPU host's env file: they parse, and say what a GPU host needs."""

from __future__ import annotations

import configparser
import os
import re
from pathlib import Path

import pytest

from app.settings import ENV_PREFIX, Settings
from workers.gpu_host import FORBIDDEN

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
UNITS = DEPLOY / "systemd"
GPU_HOST_ENV = DEPLOY / "gpu-host.env.example"
# What a GPU host holds (docs/design.md, "Hosts and boundaries"), and the unit's own variable.
GPU_HOST_SETTINGS = {"state_dir", "broker_url", "ops_url", "control_url", "control_token"}
NAMES = [
    "autopilot-api.service",
    "autopilot-control.service",
    "autopilot-beat.service",
    "autopilot-gpu@.service",
]


def parse(name: str) -> configparser.ConfigParser:
    # systemd allows repeated keys; strict=False keeps the last. No interpolation: % is systemd's.
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((UNITS / name).read_text(encoding="utf-8"), source=name)
    return parser


def test_no_other_units() -> None:
    assert sorted(p.name for p in UNITS.glob("*.service")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_unit_has_the_required_keys(name: str) -> None:
    unit = parse(name)
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    assert unit["Unit"]["Description"]
    service = unit["Service"]
    gpu_host = name == "autopilot-gpu@.service"
    env_file = "gpu-host.env" if gpu_host else "autopilot.env"
    assert service["EnvironmentFile"] == f"/etc/autopilot/{env_file}"
    assert service["ExecStart"].startswith("/srv/autopilot/.venv/bin/autopilot ")
    assert service["Restart"] == ("on-failure" if gpu_host else "always")
    assert service["User"] == "autopilot"
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert "/var/lib/autopilot" in service["ReadWritePaths"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_commands() -> None:
    assert parse("autopilot-api.service")["Service"]["ExecStart"].endswith("autopilot serve")
    assert "db upgrade" in parse("autopilot-api.service")["Service"]["ExecStartPre"]
    control = parse("autopilot-control.service")["Service"]["ExecStart"]
    assert control.endswith("autopilot worker control")
    assert parse("autopilot-beat.service")["Service"]["ExecStart"].endswith("autopilot beat")


def test_gpu_template_is_one_worker_per_gpu_index() -> None:
    service = parse("autopilot-gpu@.service")["Service"]
    assert service["ExecStart"].endswith(
        "autopilot worker gpu --kind ${AUTOPILOT_GPU_KIND} --device %i"
    )
    # Experiment children die with the worker: no orphan keeps the GPU.
    assert service["KillMode"] == "control-group"
    # Hardening that would hide or break the GPU is absent.
    for breaks_gpu in ("PrivateDevices", "DevicePolicy", "MemoryDenyWriteExecute"):
        assert breaks_gpu not in service, breaks_gpu


def assignments(path: Path) -> dict[str, str]:
    """NAME=value of each line that sets a variable, commented ones under '#NAME'."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^(#?)\s*([A-Z][A-Z0-9_]*)=(.*)$", line)
        if match:
            found[match.group(1) + match.group(2)] = match.group(3)
    return found


def test_gpu_host_env_holds_exactly_the_gpu_host_settings() -> None:
    found = assignments(GPU_HOST_ENV)
    wanted = {ENV_PREFIX + name.upper() for name in GPU_HOST_SETTINGS}
    assert set(found) == wanted | {"AUTOPILOT_GPU_KIND"}  # nothing commented out, nothing more
    assert set(Settings.model_fields) >= GPU_HOST_SETTINGS
    # The unit's variables all come from its env file.
    exec_start = parse("autopilot-gpu@.service")["Service"]["ExecStart"]
    assert set(re.findall(r"\$\{([A-Z_]+)\}", exec_start)) <= set(found)


def test_gpu_host_env_never_holds_a_forge_or_session_secret() -> None:
    text = GPU_HOST_ENV.read_text(encoding="utf-8")
    for field in FORBIDDEN:
        assert field in Settings.model_fields, field
        name = ENV_PREFIX + field.upper()
        assert not re.search(rf"^#?\s*{name}=", text, re.MULTILINE), name
        assert name in text  # named in the header, as what the host must not hold


def test_gpu_host_env_is_valid_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    settings = Settings(_env_file=str(GPU_HOST_ENV))  # type: ignore[call-arg]
    assert settings.broker_url.startswith("redis://")
    assert settings.ops_database_url.startswith("postgresql+psycopg://")
    assert settings.control_url == "http://control.lab.example:8000"
    assert settings.control_token is not None
    assert settings.github_token is None and settings.session_secret is None
    assert settings.memory_url is None
    assert str(settings.state_dir) == "/var/lib/autopilot"
