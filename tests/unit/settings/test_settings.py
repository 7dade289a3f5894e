"""Settings: embedded defaults, env overrides, bad values named, secrets redacted."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.logs import secret_values
from app.redaction import redact_text, redact_url
from app.settings import Settings, describe_validation_error


def make(**env: str) -> Settings:
    return Settings(_env_file=None, **env)  # type: ignore[call-arg, arg-type]


def test_embedded_defaults_need_no_server() -> None:
    settings = make()
    assert settings.state_dir == Path("./var")
    assert settings.memory_database_url.endswith("/var/memory.db")
    assert settings.ops_database_url.endswith("/var/ops.db")
    assert settings.memory_database_url != settings.ops_database_url
    assert settings.broker_url == "filesystem://"
    assert settings.forge == "local"
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AUTOPILOT_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("AUTOPILOT_BROKER_URL", "redis://127.0.0.1:6379/3")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.ops_database_url == f"sqlite:///{tmp_path}/ops.db"
    assert settings.broker_url == "redis://127.0.0.1:6379/3"


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("forge", "gitlab", "AUTOPILOT_FORGE"),
        ("ops_url", "not a url", "AUTOPILOT_OPS_URL"),
        ("memory_url", "mysql://x@y/z", "AUTOPILOT_MEMORY_URL"),
        ("broker_url", "amqp://guest@x", "AUTOPILOT_BROKER_URL"),
        ("port", "99999", "AUTOPILOT_PORT"),
    ],
)
def test_bad_values_name_the_variable(field: str, value: str, expected: str) -> None:
    with pytest.raises(ValidationError) as caught:
        make(**{field: value})
    (line,) = describe_validation_error(caught.value)
    assert line.startswith(expected + ":")


def test_redaction_hides_every_secret() -> None:
    settings = make(
        ops_url="postgresql+psycopg://ops:s3cret-pw@db:5432/ops",
        broker_url="redis://:hunter2-redis@cache:6379/0",
        github_token="ghp_supersecrettoken",
        control_token="ap_worker-secret-token",
    )
    shown = repr(settings.redacted())
    for secret in ("s3cret-pw", "hunter2-redis", "ghp_supersecrettoken", "ap_worker-secret-token"):
        assert secret not in shown
    assert settings.redacted()["ops_url"] == "postgresql+psycopg://ops:***@db:5432/ops"
    assert settings.redacted()["github_token"] == "**********"
    assert settings.redacted()["control_token"] == "**********"
    assert "ap_worker-secret-token" in secret_values(settings)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "http://127.0.0.1:8000"),
        ({"host": "10.0.0.5", "port": "9000"}, "http://10.0.0.5:9000"),
        ({"host": "0.0.0.0"}, "http://127.0.0.1:8000"),  # noqa: S104 - a bind address
        ({"host": "::1"}, "http://[::1]:8000"),
        ({"control_url": "https://control.lab.example/"}, "https://control.lab.example"),
    ],
)
def test_control_url_defaults_to_host_and_port(env: dict[str, str], expected: str) -> None:
    assert make(**env).control_url == expected


@pytest.mark.parametrize(
    "value", ["ftp://control:21", "control.lab:8000", "http://worker:ap_tok@control:8000"]
)
def test_control_url_must_be_a_plain_http_url(value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        make(control_url=value)
    (line,) = describe_validation_error(caught.value)
    assert line.startswith("AUTOPILOT_CONTROL_URL:")
    assert "ap_tok" not in line


def test_dashboard_url_defaults_to_the_apis_dashboard_and_refuses_credentials() -> None:
    assert make().dashboard_base_url == "http://127.0.0.1:8000/dashboard"
    moved = make().model_copy(update={"control_url": "http://10.0.0.5:9000"})
    assert moved.dashboard_base_url == "http://10.0.0.5:9000/dashboard"
    public = make(dashboard_url="https://autopilot.lab.example/dashboard/")
    assert public.dashboard_base_url == "https://autopilot.lab.example/dashboard"
    for value in ("autopilot.lab/dashboard", "https://rev:ghp_tok@autopilot.lab/dashboard"):
        with pytest.raises(ValidationError) as caught:
            make(dashboard_url=value)
        (line,) = describe_validation_error(caught.value)
        assert line.startswith("AUTOPILOT_DASHBOARD_URL:") and "ghp_tok" not in line


def test_redact_url_and_text() -> None:
    assert redact_url("https://x-access-token:tok@github.com/o/r.git") == (
        "https://x-access-token:***@github.com/o/r.git"
    )
    assert redact_url("https://github.com/o/r.git") == "https://github.com/o/r.git"
    assert "tok123" not in redact_text("fatal: https://u:tok123@h/r.git not found")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://ghp_abc123@github.com/x", "https://***@github.com/x"),
        ("https://ghp_abc123:@github.com/x", "https://***@github.com/x"),
        ("https://ghp_abc123:x-oauth-basic@github.com/x", "https://***@github.com/x"),
        ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql+psycopg://ops:s3cret@db:5432/ops", "postgresql+psycopg://ops:***@db:5432/ops"),
        ("https://u:p@ss@host/r", "https://u:***@host/r"),  # an unescaped '@' in the password
        ("HTTPS://tok@github.com/x", "HTTPS://***@github.com/x"),
        ("ssh://git@github.com/o/r.git", "ssh://git@github.com/o/r.git"),  # a login name
        ("git+ssh://git@host/r", "git+ssh://git@host/r"),
        ("ssh://git:pw@host/r", "ssh://git:***@host/r"),
        ("git@github.com:o/r.git", "git@github.com:o/r.git"),  # scp-like: no scheme
        ("https://github.com/o/r.git", "https://github.com/o/r.git"),
        ("https://github.com/a@b", "https://github.com/a@b"),  # '@' after the authority
    ],
)
def test_redact_url_hides_any_userinfo_but_an_ssh_login(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert (
        redact_text(f"fatal: cannot fetch '{url}': denied")
        == f"fatal: cannot fetch '{shown}': denied"
    )


def test_redact_text_hides_a_token_only_userinfo_in_every_url() -> None:
    text = "push https://ghp_abc123@github.com/o/r failed; then https://tok2@h2/r; ssh://git@h3/r"
    shown = redact_text(text)
    assert "ghp_abc123" not in shown and "tok2" not in shown
    assert "https://***@github.com/o/r" in shown and "https://***@h2/r" in shown
    assert "ssh://git@h3/r" in shown


def test_redact_text_stops_at_the_end_of_a_quoted_url() -> None:
    text = '["https://mirror.lab/simple","https://tok@h/x"]'
    assert redact_text(text) == '["https://mirror.lab/simple","https://***@h/x"]'
