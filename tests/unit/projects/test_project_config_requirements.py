"""`python_requirements` in autopilot.toml: requirements only, never pip options or paths."""

from __future__ import annotations

import json

import pytest

from app.projects import config


def parse_with(*lines: str) -> config.ProjectConfig:
    return config.parse(
        f'[project]\nname = "demo"\npython_requirements = {json.dumps(list(lines))}\n'
        '[experiments.e]\nentry = "pkg.bench"\n',
        "autopilot.toml",
    )


@pytest.mark.parametrize(
    "line",
    [
        "numpy",
        "numpy>=1.26",
        "torch==2.3.*",
        "scipy >= 1.11, < 2",
        "Django~=4.2.0",
        "requests[socks,security]==2.31.0",
        'torch==2.3.1 ; platform_machine == "x86_64"',
        'pkg_name.with-dots>=1.0.post1; python_version < "3.12" and extra == "gpu-x"',
        "mylib @ https://files.example.org/mylib-1.0-py3-none-any.whl",
        "mylib @ git+https://github.com/o/mylib@v1.0",
        "# a comment",
        "",
    ],
)
def test_plain_requirements_are_accepted(line: str) -> None:
    assert parse_with(line).project.python_requirements == [line]


@pytest.mark.parametrize(
    "line",
    [
        "--index-url http://evil.example/simple",
        "--index-url=http://evil.example/simple",
        "-i http://evil.example/simple",
        "--extra-index-url http://evil.example/simple",
        "--trusted-host evil.example",
        "-f http://evil.example/links",
        "--find-links=/tmp/wheels",
        "-r other.txt",
        "--requirement other.txt",
        "-c constraints.txt",
        "-e git+https://github.com/o/r#egg=r",
        "--editable ./pkg",
        "--no-index",
        "--pre",
        "  --index-url http://evil.example/simple",
        "numpy --config-settings=--build-option=x",
        "numpy --global-option=build_ext",
        "numpy --install-option=--prefix=/tmp",
        "numpy==1.26.4 --hash=sha256:" + "0" * 64,
        'numpy ; python_version > "3" --index-url http://evil.example/simple',
        "numpy\t--index-url=http://evil.example/simple",
    ],
)
def test_a_pip_option_is_refused_naming_the_line(line: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        parse_with("numpy>=1.26", line)
    message = str(caught.value)
    assert message.startswith("autopilot.toml: key 'project.python_requirements':")
    assert repr(line) in message
    assert "pip option" in message and "PIP_INDEX_URL" in message


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("./pkg", "is not a requirement"),
        ("../sibling", "is not a requirement"),
        ("/opt/wheels/pkg", "is not a requirement"),
        ("pkg/sub", "is not a requirement"),
        ("file:///opt/pkg", "is not a requirement"),
        ("git+https://github.com/o/r", "is not a requirement"),
        ("https://files.example.org/x-1.0.tar.gz", "is not a requirement"),
        ("pkg-1.0-py3-none-any.whl", "is not a requirement"),
        ("pkg.tar.gz", "is not a requirement"),
        ("pkg @ file:///opt/pkg", "https:// or git+https://"),
        ("pkg @ http://files.example.org/pkg.whl", "https:// or git+https://"),
        ("pkg @ ./pkg", "https:// or git+https://"),
        ("pkg @ https://ghp_tok@github.com/o/r.whl", "credentials"),
        ("pkg @ git+https://u:pw@github.com/o/r", "credentials"),
        ("pkg @ https://example.org/${PIP_INDEX_URL}", "${VAR}"),
        ("numpy\n--index-url=http://evil.example/simple", "one line"),
        ("numpy \\", "one line"),
    ],
)
def test_paths_urls_and_tricks_are_refused_naming_the_line(line: str, reason: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        parse_with(line)
    message = str(caught.value)
    assert reason in message
    assert "python_requirements line" in message


def test_a_refused_line_does_not_echo_its_credentials() -> None:
    with pytest.raises(config.ConfigError) as caught:
        parse_with("pkg @ git+https://u:hunter2-pw@github.com/o/r")
    assert "hunter2-pw" not in str(caught.value)
    assert "u:***@github.com" in str(caught.value)
