"""The experiment's environment: allow-list in, secrets and injection variables out."""

from pathlib import Path

import pytest

from workers.launcher.environment import EnvError, build_child_env, validate_extra

WORKER_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/w",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "GITHUB_TOKEN": "ghp_secret",
    "AUTOPILOT_GITHUB_TOKEN": "ghp_secret2",
    "AUTOPILOT_OPS_URL": "postgresql://u:pw@db/ops",
    "DATABASE_URL": "postgresql://u:pw@db/x",
    "AWS_SECRET_ACCESS_KEY": "k",
    "LD_PRELOAD": "/evil.so",
    "LD_AUDIT": "/evil.so",
    "LD_LIBRARY_PATH": "/opt/lib",
    "PYTHONSTARTUP": "/evil.py",
    "PYTHONHOME": "/elsewhere",
    "PYTHONPATH": "/worker/src",
    "BASH_ENV": "/evil.sh",
    "ENV": "/evil.sh",
    "GIT_SSH_COMMAND": "evil",
    "GIT_ASKPASS": "evil",
    "SOMETHING_ELSE": "x",
}


def _env(**kw: object) -> dict[str, str]:
    args: dict[str, object] = {
        "base_env": WORKER_ENV,
        "venv": Path("/v/proj"),
        "runtime_dir": Path("/tmp/ap-1"),
        "events_path": Path("/tmp/ap-1/ev.sock"),
        "result_path": Path("/tmp/ap-1/result.json"),
        "spec_path": Path("/tmp/ap-1/spec.json"),
        "cuda_visible_devices": "1",
    }
    args.update(kw)
    return build_child_env(**args)  # type: ignore[arg-type]


def test_only_the_allow_list_and_the_protocol_reach_the_job() -> None:
    env = _env(pythonpath=[Path("/wt")], requirements_hash="abc")
    assert set(env) == {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "PYTHONSAFEPATH",
        "PYTHONNOUSERSITE",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPATH",
        "TMPDIR",
        "CUDA_VISIBLE_DEVICES",
        "AUTOPILOT_SPEC",
        "AUTOPILOT_EVENTS",
        "AUTOPILOT_RESULT",
        "AUTOPILOT_REQUIREMENTS_HASH",
    }
    assert env["PYTHONSAFEPATH"] == "1"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # a run leaves no bytecode in its tree
    assert env["PYTHONPATH"] == "/wt"  # the worktree, never the worker's PYTHONPATH
    assert env["TMPDIR"] == "/tmp/ap-1"
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["PATH"] == "/v/proj/bin:/usr/bin:/bin"
    assert not any("secret" in v or "pw@" in v or "evil" in v for v in env.values())


def test_no_pythonpath_unless_asked() -> None:
    assert "PYTHONPATH" not in _env()


@pytest.mark.parametrize(
    "name",
    [
        "GITHUB_TOKEN",
        "MY_API_KEY",
        "DB_PASSWORD",
        "AUTOPILOT_X",
        "LD_PRELOAD",
        "LD_AUDIT",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "BASH_ENV",
        "ENV",
        "GIT_SSH_COMMAND",
        "DATABASE_URL",
        "TMPDIR",
        "PYTHONPATH",
        "AUTOPILOT_EVENTS",
        "lower",
        "1BAD",
        "A-B",
    ],
)
def test_extra_variables_that_are_refused(name: str) -> None:
    with pytest.raises(EnvError, match=name.split("_")[0] if name.isupper() else "form"):
        validate_extra({name: "v"})


def test_extra_variables_that_are_allowed_pass_through() -> None:
    env = _env(extra={"OMP_NUM_THREADS": "4", "LD_LIBRARY_PATH": "/opt/cuda/lib64"})
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["LD_LIBRARY_PATH"] == "/opt/cuda/lib64"


def test_a_url_with_a_password_is_refused_whatever_its_name() -> None:
    with pytest.raises(EnvError, match="password"):
        validate_extra({"DATA_SOURCE": "postgresql://me:hunter2@db/x"})
    assert validate_extra({"DATA_SOURCE": "https://example.org/data.tar"})
