"""A venv's key: its requirements, with a local folder (the harness) counted by its content."""

from __future__ import annotations

import shutil
from pathlib import Path

from workers.launcher.venv import requirements_hash
from workers.launcher.venv_build import installer_for

HARNESS = Path(__file__).resolve().parents[3] / "experiments" / "harness"


def test_the_key_follows_the_harness_content_not_its_path(tmp_path: Path) -> None:
    one = shutil.copytree(HARNESS, tmp_path / "one" / "harness")
    two = shutil.copytree(HARNESS, tmp_path / "elsewhere" / "harness-moved")
    key = requirements_hash(["numpy>=1.26", str(one)])
    assert requirements_hash([str(two), "numpy>=1.26"]) == key  # moved: same venv
    # what a build leaves in the folder is not its content
    (two / "build").mkdir()
    (two / "build" / "x.py").write_text("built")
    (two / "autopilot_harness" / "__pycache__").mkdir(exist_ok=True)
    (two / "autopilot_harness" / "__pycache__" / "stats.pyc").write_bytes(b"\0")
    assert requirements_hash([str(two), "numpy>=1.26"]) == key
    stats = two / "autopilot_harness" / "stats.py"
    stats.write_text(stats.read_text() + "\n# changed\n")
    assert requirements_hash([str(two), "numpy>=1.26"]) != key  # changed: a new venv
    (two / "autopilot_harness" / "extra.py").write_text("")
    assert requirements_hash([str(one), "numpy>=1.26"]) == key


def test_the_key_ignores_order_comments_and_blank_lines() -> None:
    assert requirements_hash(["a", "# c", "", " b "]) == requirements_hash(["b", "a"])
    assert requirements_hash(["a"]) != requirements_hash(["a", "b"])


def test_uv_builds_every_venv_but_a_non_inheriting_torch_one() -> None:
    assert installer_for(["numpy", "/srv/harness"], system_site_packages=False) == "uv"
    assert installer_for(["torch==2.3.*", "numpy"], system_site_packages=True) == "uv"
    for line in ("torch", "torch==2.3.*", 'Torch>=2 ; platform_machine == "x86_64"', "torchvision"):
        assert installer_for([line], system_site_packages=False) == "pip", line
    assert installer_for(["torchmetrics"], system_site_packages=False) == "uv"
