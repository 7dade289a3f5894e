"""Venvs built by uv, for real: the lock recorded in the completion marker, the caches under
the state dir, torch never resolved by uv (a venv that inherits the host's gets the host's), and
the same build sandboxed."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from app.sandbox import confined
from workers.launcher.venv import COMPLETE_MARKER, ensure_venv
from workers.launcher.venv_build import UV_CACHE_DIR

# A package with an in-tree PEP 517 backend and no build requirement: nothing is downloaded.
BACKEND = """
import base64, hashlib, os, zipfile

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    dist = "autopilot_tiny-0.3.dist-info"
    files = {
        "autopilot_tiny.py": "VALUE = 42\\n",
        dist + "/METADATA": "Metadata-Version: 2.1\\nName: autopilot-tiny\\nVersion: 0.3\\n",
        dist + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(dist + "/RECORD,,")
    name = "autopilot_tiny-0.3-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(dist + "/RECORD", "\\n".join(record) + "\\n")
    return name
"""


def tiny_package(root: Path) -> Path:
    pkg = root / "tiny-pkg"
    pkg.mkdir()
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = []
            build-backend = "tinybackend"
            backend-path = ["."]
            """
        )
    )
    (pkg / "tinybackend.py").write_text(BACKEND)
    return pkg


def run_in(venv: Path, code: str) -> str:
    out = subprocess.run(  # noqa: S603 - the venv's own interpreter, fixed code
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "sandboxed"])
def test_uv_builds_the_venv_and_records_its_lock(tmp_path: Path, sandboxed: bool) -> None:
    if sandboxed and (reason := confined.check()):
        pytest.skip(f"no sandbox here: {reason}")
    state = tmp_path / "state"
    steps: list[str] = []

    built = ensure_venv(
        state,
        "tiny",
        [str(tiny_package(tmp_path))],
        sandboxed=sandboxed,
        progress=lambda phase, _line: steps.append(phase),
    )

    assert built.built
    assert "uv = " in (built.path / "pyvenv.cfg").read_text()  # made by `uv venv`
    assert run_in(built.path, "import autopilot_tiny; print(autopilot_tiny.VALUE)") == "42"
    record = built.environment()
    assert record["installer"] == "uv" and record["key"] == built.requirements_hash
    assert record["lock"] == [f"autopilot-tiny @ file://{built.path}/src/0-tiny-pkg"]
    marker = json.loads((built.path / COMPLETE_MARKER).read_text())
    assert marker["lock"] == record["lock"] and marker["build_s"] > 0
    assert [s for s in dict.fromkeys(steps)] == ["create", "install", "check", "freeze", "done"]
    # uv's cache is the state dir's, never the worker's ~/.cache, and the project's own
    assert (state / "venvs" / UV_CACHE_DIR / "tiny").is_dir()
    assert any((state / "venvs" / UV_CACHE_DIR / "tiny").iterdir())
    assert [p.name for p in (state / "venvs" / UV_CACHE_DIR).iterdir()] == ["tiny"]
    again = ensure_venv(state, "tiny", [str(tmp_path / "tiny-pkg")])
    assert not again.built and again.environment()["lock"] == record["lock"]


def test_uv_never_resolves_torch_an_inheriting_venv_gets_the_hosts(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the service's venv holds the host's torch
    lines: list[str] = []

    built = ensure_venv(
        tmp_path,
        "torchy",
        ["torch"],
        system_site_packages=True,
        progress=lambda _phase, line: lines.append(line),
    )

    assert built.environment()["installer"] == "uv"
    assert built.environment()["lock"] == []  # torch is not the venv's own
    assert not list(built.path.glob("lib/python*/site-packages/torch"))
    where = run_in(built.path, "import torch; print(torch.__file__)")
    assert not where.startswith(str(built.path))  # the host's torch, inherited
    assert not [line for line in lines if "Downloading torch" in line or "+ torch" in line]
