"""Where a command agent works, and how its work comes back.

The agent gets one directory and nothing else writable (`work/`): a scratch clone of the
cycle's base commit (`work/repo/`) and its files (`work/files/`: prompt, context, proposal).
What the control host writes or reads back (the logs, the bundle it fetches) is checked to be
a plain file and never opened through a link the agent planted: the logs live beside `work/`,
out of its reach. It runs in the
sandbox (`app/sandbox/`), keeps the network (it calls its model) and gets no service secret.
Its commits come back as a git bundle that `pack` writes, also inside the sandbox, so that no
hook, fsmonitor or config the agent planted in its clone ever runs outside it; the control host
fetches the bundle as objects (docs/design.md, "Hosts and boundaries").
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.agents.exceptions import AgentFailed
from app.sandbox import bwrap, confined

#: Commits what the agent left uncommitted, then bundles base..HEAD (nothing when unchanged).
_PACK = """\
set -eu
git add --all
if ! git diff --cached --quiet; then
  git commit --quiet --no-verify --no-gpg-sign -m "$AUTOPILOT_MESSAGE"
fi
rm -f "$AUTOPILOT_BUNDLE"
if [ "$(git rev-parse HEAD)" != "$AUTOPILOT_BASE" ]; then
  git bundle create --quiet "$AUTOPILOT_BUNDLE" HEAD "^$AUTOPILOT_BASE"
fi
"""


#: The most an agent's bundle (its commits) may weigh.
MAX_BUNDLE_BYTES = 256 * 1024 * 1024
#: The most a proposal.json may weigh.
MAX_PROPOSAL_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Workspace:
    root: Path

    @property
    def work(self) -> Path:
        """The only directory the agent may write (bound into its sandbox)."""
        return self.root / "work"

    @property
    def repo(self) -> Path:
        return self.work / "repo"

    @property
    def files(self) -> Path:
        return self.work / "files"

    @property
    def bundle(self) -> Path:
        return self.work / "agent.bundle"

    @property
    def output_log(self) -> Path:
        return self.root / "output.log"

    @property
    def pack_log(self) -> Path:
        return self.root / "pack.log"

    def reset(self) -> None:
        """An empty workspace (what an earlier run left is dropped)."""
        if self.root.exists():
            shutil.rmtree(self.root)
        self.files.mkdir(parents=True)


def read_plain_file(path: Path, limit: int) -> bytes | None:
    """The bytes of `path` if it is a plain file of at most `limit` bytes (never through a link,
    a FIFO or a device the agent left there); None when there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AgentFailed(
            f"{path.name} is not a plain file the agent wrote ({exc.strerror})"
        ) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise AgentFailed(f"{path.name} is not a plain file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise AgentFailed(f"{path.name} is larger than {limit} bytes")
    return data


def tool_paths(argv0: str, search_path: str) -> list[Path]:
    """What must be readable for the agent's program to start: the venv it lives in (with
    `pyvenv.cfg`), else its own directory, unless the system paths already hold it; the same
    for the file a symlinked program resolves to (`~/.local/bin/claude` links to its version's
    install, an npm bin to its package)."""
    found = shutil.which(argv0, path=search_path) if os.sep not in argv0 else argv0
    if not found:
        return []
    system = bwrap.system_read_only()
    paths: list[Path] = []
    for program in (Path(os.path.abspath(found)), Path(os.path.realpath(found))):
        if any(program.is_relative_to(p) for p in system):
            continue
        venv = next((p for p in program.parents if (p / "pyvenv.cfg").is_file()), None)
        paths.append(venv or program.parent)
    return list(dict.fromkeys(paths))


def policy(
    workspace: Workspace,
    env: Mapping[str, str],
    argv: Sequence[str],
    *,
    read_only: Sequence[Path] = (),
) -> bwrap.Policy:
    tools = tool_paths(argv[0], env.get("PATH", "")) if argv else []
    return bwrap.Policy(
        cwd=workspace.repo,
        env=dict(env),
        read_only=[*tools, *read_only],
        writable=[workspace.work],
        network=True,
        # Its files dir, not the clone: what a CLI keeps in ~ (.claude.json, .codex/) stays
        # out of the change that comes back.
        home=workspace.files,
    )


def pack(
    workspace: Workspace,
    base_sha: str,
    *,
    name: str,
    author: tuple[str, str],
    message: str,
    enabled: bool,
    time_limit_s: float = 120.0,
) -> Path | None:
    """Bundle the agent's commits (its uncommitted changes committed first), in the sandbox;
    the bundle, or None when the agent changed nothing."""
    who, email = author
    env = bwrap.allow_env(os.environ, bwrap.BASE_ENV_NAMES) | {
        "HOME": str(workspace.files),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": who,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": who,
        "GIT_COMMITTER_EMAIL": email,
        "AUTOPILOT_MESSAGE": message,
        "AUTOPILOT_BASE": base_sha,
        "AUTOPILOT_BUNDLE": str(workspace.bundle),
    }
    log = workspace.pack_log
    code = confined.run(
        ["/bin/sh", "-c", _PACK],
        bwrap.Policy(cwd=workspace.repo, env=env, writable=[workspace.work]),
        name=name,
        timeout_s=time_limit_s,
        log_path=log,
        sandbox=enabled,
    )
    if code != 0:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise AgentFailed(f"committing the agent's changes failed (exit {code}): {tail.strip()}")
    # Nothing of the sandbox runs any more (its cgroup is gone): what lies there now stays.
    try:
        info = os.lstat(workspace.bundle)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise AgentFailed("the agent's bundle is not a plain file (a link or a directory)")
    if info.st_size > MAX_BUNDLE_BYTES:
        raise AgentFailed(
            f"the agent's change weighs {info.st_size} bytes as a bundle; at most "
            f"{MAX_BUNDLE_BYTES} are taken"
        )
    return workspace.bundle
