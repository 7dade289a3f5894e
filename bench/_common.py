"""What the benchmarks share: their command line, statistics, the machine they ran on, the JSON
tail, the probe research repo they register, and the real processes they start.

Each bench runs as a script (`python bench/<name>.py`), so this folder is `sys.path[0]` and
`import _common` finds this file. Importing it puts the repository root on `sys.path` too, so a
bench imports `app` and `workers` without PYTHONPATH.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import git
import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from workers.launcher import confine  # noqa: E402 - the line above makes it importable
from workers.launcher.launch import LaunchSpec  # noqa: E402
from workers.launcher.runtime import RuntimeDir  # noqa: E402

# -- command line -------------------------------------------------------------------------------


def bench_parser(doc: str, quick: str | None = None) -> argparse.ArgumentParser:
    """A bench's parser: its docstring's first line, `--json`, and `--quick` (what it cuts)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


# -- statistics ---------------------------------------------------------------------------------


def percentile(values: list[float], q: float, *, interpolate: bool = False) -> float:
    """The q-quantile of `values` (q in 0..1): the nearest rank, or with `interpolate` linear
    between the two nearest ranks. NaN when there are no values."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = q * (len(data) - 1)
    if not interpolate:
        return data[min(len(data) - 1, max(0, round(pos)))]
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


# -- the machine --------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name: lscpu's, else /proc/cpuinfo's, else what `platform` knows."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False)
        for line in out.stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def today() -> str:
    """The run's date (UTC), as the results carry it."""
    return datetime.now(UTC).date().isoformat()


MACHINE_FIELDS: dict[str, Callable[[], Any]] = {
    "cpu": cpu_model,
    "cores": os.cpu_count,
    "python": platform.python_version,
    "os": platform.platform,
    "date": today,
}


def machine(*fields: str, **extra: Any) -> dict[str, Any]:
    """The machine a run measured on: the named MACHINE_FIELDS in order, then the bench's own."""
    return {**{name: MACHINE_FIELDS[name]() for name in fields}, **extra}


def machine_line() -> str:
    """The machine in one line: CPU model, cores, Python."""
    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}"


# -- the result ---------------------------------------------------------------------------------


def print_json(result: dict[str, Any], indent: int | None = None) -> None:
    print(json.dumps(result, indent=indent, ensure_ascii=False))


def emit(
    result: dict[str, Any],
    as_json: bool,
    *,
    indent: int | None = None,
    width: int = 22,
    text: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """The bench's output: with --json the one JSON object; else `text`, or a line a field."""
    if as_json:
        print_json(result, indent)
    elif text is not None:
        text(result)
    else:
        for key, value in result.items():
            print(f"{key:{width}} {value}")


# -- the probe project and its jobs ------------------------------------------------------------

# The probe experiment the service benches register: reports its first line, sleeps its
# `sleep_s` parameter, and writes fixed raw paired samples for the control plane to judge.
PROBE = '''
"""A tiny experiment: reports its first line, sleeps `sleep_s`, writes raw samples."""
import json, os, socket, time

def send(event):
    path = os.environ.get("AUTOPILOT_EVENTS")
    if path:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall((json.dumps(event) + "\\n").encode())
        s.close()

send({"type": "started"})
spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))
params = spec["parameters"]
time.sleep(params["sleep_s"])
# Raw paired samples for the control plane to judge (it never takes a self-reported verdict).
a = [1000000 + 997 * (i % 5) for i in range(10)]
b = [v + 311 * ((3 * i) % 4) - 400 for i, v in enumerate(a)]
pairs = {"a_ns": a, "b_ns": b}
json.dump({"status": "ok", "experiment": spec["experiment"], "parameters": params,
           "noise_floor": {"samples": pairs},
           "comparisons": [{"variant": "probe", "baseline": "base", "samples": pairs,
                            "accuracy": {"max_abs_error": 0.0, "scale": 1.0}}]},
          open(os.environ["AUTOPILOT_RESULT"], "w"))
'''


def ts(value: Any) -> float | None:
    """A stored or served timestamp (UTC, with or without offset; text or datetime) as epoch
    seconds."""
    if not value:
        return None
    parsed = (
        value
        if isinstance(value, datetime)
        else datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    )
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def probe_config(
    name: str,
    experiment: str,
    entry: str,
    time_limit_s: int,
    parameters: dict[str, list[Any]],
    defaults: dict[str, Any] | None = None,
) -> str:
    """The autopilot.toml of a probe project: one CPU experiment, its space and defaults."""
    lines = [
        "",
        "[project]",
        f'name = "{name}"',
        'gpu_kind = "cpu"',
        "python_requirements = []",
        "",
        f"[experiments.{experiment}]",
        f'entry = "{entry}"',
        f"time_limit_s = {time_limit_s}",
        "",
        f"[experiments.{experiment}.parameters]",
        *(f"{key} = {json.dumps(values)}" for key, values in parameters.items()),
    ]
    if defaults:
        lines += ["", f"[experiments.{experiment}.defaults]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in defaults.items()]
    return "\n".join(lines) + "\n"


def make_probe_repo(
    root: Path, name: str, package: str, main: str, config: str, message: str
) -> Path:
    """A research repo at root/name, committed on `main`: the package `package` whose
    `main.py` is `main`, and `config` as its autopilot.toml."""
    repo_dir = root / name
    (repo_dir / package).mkdir(parents=True)
    files = {
        f"{package}/__init__.py": "",
        f"{package}/main.py": textwrap.dedent(main),
        "autopilot.toml": config,
    }
    for path, content in files.items():
        (repo_dir / path).write_text(content)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(list(files))
    actor = git.Actor("bench", "bench@example.invalid")
    repo.index.commit(message, author=actor, committer=actor)
    return repo_dir


def module_job(
    venv: Path,
    entry: str,
    worktree: Path,
    runtime: RuntimeDir,
    base_env: dict[str, str],
    requirements_hash: str | None = None,
    sandboxed: bool = False,
    cgroup: bool | None = None,
) -> LaunchSpec:
    """A job that runs the module `entry` of `worktree` in `venv`, on no GPU, no spec;
    `sandboxed`: under bubblewrap; `cgroup` (default: when sandboxed): in a cgroup of its own
    named as a GPU worker names its jobs' (`job-0.w<pid>`), where the host has one."""
    return LaunchSpec(
        venv=venv,
        entry=entry,
        cwd=worktree,
        runtime=runtime,
        spec={},
        pythonpath=[worktree],
        base_env=base_env,
        cuda_visible_devices="",
        requirements_hash=requirements_hash,
        sandboxed=sandboxed,
        cgroup=confine.job_cgroup_name(0) if (sandboxed if cgroup is None else cgroup) else None,
    )


# -- real processes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(env: dict[str, str], cwd: Path, *args: str) -> str:
    """`autopilot <args>` in a child with `env`; its stdout, or RuntimeError with its stderr."""
    done = subprocess.run(  # noqa: S603 - our own CLI, fixed argv
        [sys.executable, "-m", "workers.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"autopilot {' '.join(args)} failed: {done.stderr or done.stdout}")
    return done.stdout.strip()


def register_probe(env: dict[str, str], cwd: Path, project: str, repo: Path) -> str:
    """Bring the stores up, register `repo` as `project`, and return a fresh admin token."""
    run_cli(env, cwd, "db", "upgrade")
    run_cli(env, cwd, "project", "create", "--name", project, "--repo-url", str(repo))
    return new_token(env, cwd, "bench", "admin")


def new_token(env: dict[str, str], cwd: Path, name: str, scope: str) -> str:
    """A fresh API token with `scope` (`worker`: what a GPU host fetches the forge with)."""
    token = run_cli(env, cwd, "token", "create", "--name", name, "--scope", scope)
    return token.splitlines()[-1].strip()


def autopilot_env(updates: dict[str, str]) -> dict[str, str]:
    """This process's environment without its AUTOPILOT_* settings, then `updates`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
    env.update(updates)
    return env


@dataclass
class Services:
    """The processes a bench starts, each in its own process group, logging to log_dir/name.log."""

    env: dict[str, str]
    log_dir: Path
    cwd: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(
        self, name: str, argv: list[str], extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives with the child
        proc = subprocess.Popen(
            argv,
            env={**self.env, **(extra_env or {})},
            cwd=self.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, ended as a whole
        )
        log.close()
        self.procs[name] = proc
        return proc

    def cli(
        self, name: str, *args: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        return self.start(name, [sys.executable, "-m", "workers.cli", *args], extra_env)

    def stop(self, name: str, timeout: float = 20.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        # Whatever the leader left in its group (an experiment, a pool thread's child) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for name in list(self.procs):
            with contextlib.suppress(Exception):
                self.stop(name)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")


def wait_http(url: str, services: Services, timeout: float = 60.0) -> None:
    """Wait until `url` answers 200, failing early when one of `services` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        services.check_alive()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout:g} s")
