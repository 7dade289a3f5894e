"""Small helpers shared by tests (fixtures live in conftest files)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

T = TypeVar("T")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_for(condition: Callable[[], T], timeout: float = 30.0, interval: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """An ASGI app served by uvicorn in a thread on 127.0.0.1:<free port>; yields its base URL."""

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # bound before the server starts: no race for the port
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


class GitDaemon:
    """Git's own `git daemon` serving the repositories under `root` on a loopback port: a real
    remote repository server (the git:// protocol), as a lab's git host would be."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                "--informative-errors",
                f"--base-path={root}",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                str(root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(lambda: port_open(self.port), timeout=20)

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        # git daemon forks a child per connection: stop the whole session
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=20)


def alive(pid: int) -> bool:
    """Whether `pid` is a living process: a zombie has exited and only waits to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def living_with(token: str) -> list[int]:
    """Pids of the living processes whose argv holds `token`: a sandboxed process's own pid is
    one of its namespace, so the host finds it by what it runs."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if token.encode() not in (entry / "cmdline").read_bytes():
                continue
        except OSError:
            continue
        if alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def committed_repo(root: Path, name: str, files: dict[str, str], message: str) -> Path:
    """A git repository `root/name` on branch main holding `files` (path -> text, dedented) in
    one commit: a research repository as a lab has it."""
    import textwrap

    import git

    repo_dir = root / name
    for path, text in files.items():
        (repo_dir / path).parent.mkdir(parents=True, exist_ok=True)
        (repo_dir / path).write_text(textwrap.dedent(text))
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(list(files))
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit(message, author=actor, committer=actor)
    return repo_dir
