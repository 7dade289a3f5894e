"""Attacks on the sandbox with real bubblewrap and real cgroups: each test tries what untrusted
code would try (read the service's secrets, write outside its dirs, reach a local server,
outlive its run) and asserts it failed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.sandbox.bwrap import BASE_ENV_NAMES, Policy, allow_env, system_read_only
from app.sandbox.cgroups import Cgroup
from app.sandbox.confined import check, run
from app.sandbox.exceptions import SandboxTimeout
from tests.conftest import REQUIRE_SERVICES

UNAVAILABLE = check()
if UNAVAILABLE and not REQUIRE_SERVICES:
    pytest.skip(f"no sandbox on this host: {UNAVAILABLE}", allow_module_level=True)

# The base interpreter, so that nothing of the checkout (its venv included) needs binding.
PYTHON = str(Path(sys.base_prefix, "bin", "python3"))
CHECKOUT = Path(__file__).resolve().parents[3]
CANARY = "canary-" + uuid.uuid4().hex


@pytest.fixture(autouse=True)
def _sandbox_required() -> None:
    if UNAVAILABLE:
        pytest.fail(f"AUTOPILOT_TEST_REQUIRE_SERVICES=1 needs the sandbox: {UNAVAILABLE}")


def wait_for(condition: Callable[[], Any], what: str, deadline_s: float = 10.0) -> Any:
    deadline = time.monotonic() + deadline_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        time.sleep(0.02)
    return value


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def pids_named(marker: str) -> list[int]:
    """Processes whose argv[0] is `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(
                f"{marker}\0".encode()
            ):
                found.append(int(entry.name))
        except OSError:
            pass
    return found


class Sandbox:
    """A working dir (the only writable one) and a helper that runs a Python script in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"
        self.work.mkdir()
        self.log = root / "run.log"
        self.env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "MARK": "policy-env"}

    def policy(self, **kw: Any) -> Policy:
        return Policy(**{"cwd": self.work, "env": self.env, "writable": [self.work], **kw})

    def run(self, script: str, *args: str, sandbox: bool = True, **kw: Any) -> dict[str, Any]:
        """Run `script` (dedented); it reports by writing JSON to `out.json` in its cwd."""
        (self.work / "probe.py").write_text(textwrap.dedent(script))
        out = self.work / "out.json"
        out.unlink(missing_ok=True)
        timeout_s, stdin = kw.pop("timeout_s", 60), kw.pop("stdin", None)
        rc = run(
            [PYTHON, "probe.py", *args],
            self.policy(**kw),
            name="test-" + uuid.uuid4().hex[:12],
            timeout_s=timeout_s,
            log_path=self.log,
            sandbox=sandbox,
            stdin=stdin,
        )
        assert rc == 0, self.log.read_text()
        result: dict[str, Any] = json.loads(out.read_text())
        return result


@pytest.fixture
def box(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path)


def test_parent_secrets_are_invisible_inside(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOPILOT_SECRET_CANARY", CANARY)
    seen = box.run(
        """
        import json, os
        environs, cmdlines = {}, {}
        for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
            for name, into in (("environ", environs), ("cmdline", cmdlines)):
                try:
                    into[pid] = open(f"/proc/{pid}/{name}", "rb").read().decode(errors="replace")
                except OSError as exc:
                    into[pid] = f"unreadable: {exc}"
        json.dump({"env": dict(os.environ), "environs": environs, "cmdlines": cmdlines,
                   "pid": os.getpid(), "ppid": os.getppid()}, open("out.json", "w"))
        """
    )
    assert CANARY not in json.dumps(seen)
    # Only its own namespace: bwrap's init as pid 1 and the probe; no pid of the host.
    assert sorted(seen["environs"]) == ["1", "2"]
    assert (seen["pid"], seen["ppid"]) == (2, 1)
    assert seen["cmdlines"]["1"].startswith("/usr/bin/bwrap\0")
    # The reads worked: the assertions above are not vacuous.
    assert "MARK=policy-env" in seen["environs"]["2"]
    assert seen["environs"]["1"] == ""


def test_environment_is_exactly_the_policy(box: Sandbox, tmp_path: Path) -> None:
    seen = box.run("import json, os; json.dump(dict(os.environ), open('out.json', 'w'))")
    # bwrap itself adds only PWD; HOME is the sandbox's own, never the service's.
    assert seen == {**box.env, "HOME": str(box.work), "PWD": str(box.work)}
    home = tmp_path / "home"
    home.mkdir()
    seen = box.run(
        "import json, os; json.dump(dict(os.environ), open('out.json', 'w'))",
        home=home,
        env={**box.env, "HOME": "/root"},
    )
    assert seen["HOME"] == str(home)


def test_environment_stays_off_the_command_line_and_stdin_is_fed(
    box: Sandbox, tmp_path: Path
) -> None:
    """An agent's API key goes in its environment, never on bwrap's command line (which any
    user of the host could read, as the sandbox's pid 1 can); the prompt file is its stdin."""
    prompt = tmp_path / "prompt.md"
    prompt.write_text("the prompt\n")
    seen = box.run(
        """
        import json, os, sys
        json.dump({"stdin": sys.stdin.read(), "key": os.environ.get("AGENT_KEY"),
                   "cmdline": open("/proc/1/cmdline", "rb").read().decode(errors="replace"),
                   "fds": [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                           if os.path.exists(f"/proc/self/fd/{fd}")]}, open("out.json", "w"))
        """,
        env={**box.env, "AGENT_KEY": CANARY},
        stdin=prompt,
    )
    assert seen["stdin"] == "the prompt\n"
    assert seen["key"] == CANARY
    assert "--args" in seen["cmdline"]
    assert CANARY not in seen["cmdline"]
    assert "policy-env" not in seen["cmdline"]
    assert not [fd for fd in seen["fds"] if "bwrap-env" in fd], seen["fds"]
    # Without a file it reads nothing (/dev/null), as before.
    assert box.run("import json, sys; json.dump(sys.stdin.read(), open('out.json', 'w'))") == ""


def test_allow_env_passes_only_the_names_given() -> None:
    source = {"PATH": "/usr/bin", "LANG": "C", "AUTOPILOT_FORGE_TOKEN": CANARY}
    assert allow_env(source, BASE_ENV_NAMES) == {"PATH": "/usr/bin", "LANG": "C"}


def test_writes_outside_the_writable_dir_fail(box: Sandbox, tmp_path: Path) -> None:
    read_only = tmp_path / "ro"
    read_only.mkdir()
    (read_only / "kept").write_text("original")
    outside = tmp_path / "outside"
    outside.mkdir()
    targets = [read_only / "new", read_only / "kept", outside / "new", Path("/usr/new")]
    targets += [Path("/etc/new"), Path("/new"), CHECKOUT / "new"]
    seen = box.run(
        """
        import json, subprocess, sys
        errors = {}
        for path in sys.argv[2:]:
            try:
                open(path, "w").write("pwned")
                errors[path] = None
            except OSError as exc:
                errors[path] = exc.strerror
        # With capabilities left, root in the user namespace could undo the read-only bind.
        remount = subprocess.run(["mount", "-o", "remount,bind,rw", sys.argv[1]],
                                 capture_output=True).returncode
        open("mine", "w").write("written inside")
        json.dump({"errors": errors, "remount": remount}, open("out.json", "w"))
        """,
        str(read_only),
        *map(str, targets),
        read_only=[read_only],
    )
    assert all(seen["errors"].values()), seen["errors"]
    assert seen["remount"] != 0
    assert (read_only / "kept").read_text() == "original"
    assert sorted(p.name for p in read_only.iterdir()) == ["kept"]
    assert list(outside.iterdir()) == []
    assert not (CHECKOUT / "new").exists()
    assert (box.work / "mine").read_text() == "written inside"


def test_only_the_system_list_and_policy_paths_are_visible(box: Sandbox, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "env").write_text(f"AUTOPILOT_FORGE_TOKEN={CANARY}\n")
    hidden = box.work / ".git"
    hidden.mkdir()
    (hidden / "config").write_text("secret remote")
    paths = [state, CHECKOUT, Path("/work/main"), Path.home() / ".bashrc", hidden / "config"]
    seen = box.run(
        """
        import json, os, sys
        json.dump({"exists": {p: os.path.exists(p) for p in sys.argv[1:]},
                   "etc": sorted(os.listdir("/etc"))}, open("out.json", "w"))
        """,
        *map(str, paths),
        hide=[hidden],
    )
    assert not any(seen["exists"].values()), seen["exists"]
    allowed = {p.name for p in system_read_only() if p.parent == Path("/etc")}
    assert set(seen["etc"]) == allowed
    assert "passwd" in allowed
    assert (hidden / "config").read_text() == "secret remote"


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


CONNECT = """
import json, socket
try:
    socket.create_connection(("127.0.0.1", 6379), timeout=5).close()
    result = "connected"
except OSError as exc:
    result = repr(exc)
json.dump(result, open("out.json", "w"))
"""


def test_no_network_means_no_local_servers(box: Sandbox) -> None:
    assert box.run(CONNECT) != "connected"


def test_network_true_reaches_local_servers(box: Sandbox) -> None:
    if not _listening(6379):
        pytest.skip("nothing listens on 127.0.0.1:6379 outside")
    assert box.run(CONNECT, network=True) == "connected"


# Double-forks a grandchild into its own session that ignores SIGTERM/SIGHUP and sleeps forever
# under the name sys.argv[1], then waits for the file `release` before exiting.
DAEMONISE = """
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.execv("/usr/bin/sleep", [sys.argv[1], "infinity"])
    os._exit(0)
deadline = time.monotonic() + 30
while not os.path.exists("release") and time.monotonic() < deadline:
    time.sleep(0.02)
open("out.json", "w").write("{}")
"""


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "plain"])
def test_a_daemonised_grandchild_dies_with_the_run(box: Sandbox, sandbox: bool) -> None:
    marker = "autopilot-daemon-" + uuid.uuid4().hex
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.run(DAEMONISE, marker, sandbox=sandbox)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        [pid] = wait_for(lambda: pids_named(marker), "the grandchild started")
    finally:
        (box.work / "release").write_text("")
        thread.join(60)
    try:
        assert not errors, errors
        wait_for(lambda: gone(pid), f"grandchild {pid} gone", deadline_s=5)
    finally:
        if not gone(pid):  # a failed run must not leave the sleeper behind
            os.kill(pid, signal.SIGKILL)


def test_cgroup_kill_takes_the_whole_tree(tmp_path: Path) -> None:
    marker = "autopilot-daemon-" + uuid.uuid4().hex
    script = DAEMONISE.replace('"release"', '"/nonexistent"').replace("30", "0")
    with Cgroup.create("test-" + uuid.uuid4().hex[:12]) as cgroup:
        proc = subprocess.Popen(  # noqa: S603
            [PYTHON, "-c", script, marker], cwd=tmp_path, preexec_fn=cgroup.preexec()
        )
        assert proc.wait(30) == 0
        [pid] = wait_for(lambda: pids_named(marker), "the grandchild started")
        assert cgroup.pids() == [pid]
        cgroup.kill()
        wait_for(lambda: gone(pid), f"grandchild {pid} gone", deadline_s=5)
        assert cgroup.pids() == []
    assert not cgroup.path.exists()
    cgroup.remove()


def test_timeout_raises_and_leaves_nothing_behind(box: Sandbox) -> None:
    marker = "autopilot-sleeper-" + uuid.uuid4().hex
    script = f"""
        import os, time
        if os.fork() == 0:
            os.execv("/usr/bin/sleep", ["{marker}", "infinity"])
        print("started", flush=True)
        time.sleep(3600)
        """
    with pytest.raises(SandboxTimeout, match=r"1 s.*run\.log") as info:
        box.run(script, timeout_s=1)
    assert str(box.log) in str(info.value)
    assert "started" in box.log.read_text()
    assert pids_named(marker) == []


def test_a_venv_python_runs_inside(box: Sandbox) -> None:
    (box.work / "probe.py").write_text(
        "import json, sys, sqlalchemy\njson.dump(sys.prefix, open('out.json', 'w'))\n"
    )
    rc = run(
        [sys.executable, "probe.py"],
        box.policy(read_only=[Path(sys.prefix)]),
        name="test-" + uuid.uuid4().hex[:12],
        timeout_s=60,
        log_path=box.log,
    )
    assert rc == 0, box.log.read_text()
    assert json.loads((box.work / "out.json").read_text()) == sys.prefix
    assert Path(sys.prefix) != Path(sys.base_prefix)


def test_cgroup_names_are_checked() -> None:
    with pytest.raises(ValueError, match="cgroup name"):
        Cgroup.create("../escape")
