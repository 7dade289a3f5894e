"""deploy/systemd units: they parse, and say what a GPU host needs."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[3] / "deploy" / "systemd"
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
    assert service["EnvironmentFile"] == "/etc/autopilot/autopilot.env"
    assert service["ExecStart"].startswith("/srv/autopilot/.venv/bin/autopilot ")
    assert service["Restart"] == "always"
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
