"""The environment a venv build runs in: the allow-list, nothing else."""

from __future__ import annotations

import pytest

from workers.launcher.venv_build import BUILD_ENV_ALLOWED, VenvError, build_env, refuse_pip_options


def test_only_the_allow_list_and_a_private_home_pass() -> None:
    worker = {
        "PATH": "/usr/bin",
        "HOME": "/home/worker",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "PIP_INDEX_URL": "https://mirror.lab/simple",
        "PIP_CERT": "/etc/ssl/lab.pem",
        "https_proxy": "http://proxy:3128",
        "NO_PROXY": "localhost",
        "SSL_CERT_FILE": "/etc/ssl/cert.pem",
        "AUTOPILOT_GITHUB_TOKEN": "ghp_secret",
        "AUTOPILOT_LLM_API_KEY": "sk-secret",
        "AUTOPILOT_OPS_URL": "postgresql://ops:pw@db/ops",
        "DATABASE_URL": "postgresql://u:pw@db/x",
        "PYTHONPATH": "/srv/autopilot",
        "PIP_CONFIG_FILE": "/home/worker/pip.conf",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    env = build_env("/state/venvs/p.home", worker)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/state/venvs/p.home",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "PIP_INDEX_URL": "https://mirror.lab/simple",
        "PIP_CERT": "/etc/ssl/lab.pem",
        "https_proxy": "http://proxy:3128",
        "NO_PROXY": "localhost",
        "SSL_CERT_FILE": "/etc/ssl/cert.pem",
    }
    assert not [p for p in BUILD_ENV_ALLOWED if p.startswith("AUTOPILOT")]


@pytest.mark.parametrize(
    "line",
    [
        "--index-url http://evil/",
        "-r other.txt",
        "-e .",
        "numpy --hash=sha256:" + "0" * 64,
        "numpy --config-settings=x=y",
        "numpy @ https://x/${PIP_INDEX_URL}",
        "numpy\n--extra-index-url http://evil/",
        "numpy \\",
    ],
)
def test_pip_options_are_refused_naming_the_line(line: str) -> None:
    with pytest.raises(VenvError, match="pip option") as caught:
        refuse_pip_options(["numpy>=1.26", line])
    assert repr(line) in str(caught.value)


def test_requirements_and_local_folders_pass() -> None:
    refuse_pip_options(
        ["numpy>=1.26", 'torch==2.3.* ; platform_machine == "x86_64"', "/srv/autopilot/harness"]
    )


def test_uvs_own_mirror_settings_pass_its_cache_and_config_do_not() -> None:
    worker = {
        "UV_DEFAULT_INDEX": "https://mirror.lab/simple",
        "UV_CACHE_DIR": "/home/worker/.cache/uv",  # the build's cache is the state dir's
        "UV_CONFIG_FILE": "/home/worker/uv.toml",
        "UV_PUBLISH_TOKEN": "pypi-secret",
    }
    assert build_env("/h", worker) == {
        "UV_DEFAULT_INDEX": "https://mirror.lab/simple",
        "HOME": "/h",
    }
