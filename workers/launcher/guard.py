"""Preflight guard: run the venv's interpreter exactly as the job will and check it is the venv.

docs/design.md, "Launch through the venv's own python": a venv launched through a resolved
interpreter runs on the base Python
without the venv's packages, and nothing fails until the job does, on a GPU. The guard runs
before the GPU lease and a passing result is cached, so a warm launch pays nothing for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.sandbox import bwrap, confined
from app.sandbox.exceptions import SandboxTimeout
from workers.launcher import venv as venv_mod
from workers.launcher.venv import COMPLETE_MARKER, interpreter_path
from workers.launcher.venv_build import VenvError

#: Per-job paths: they differ on every launch and do not change what imports from where.
_VOLATILE = frozenset(
    {
        "AUTOPILOT_SPEC",
        "AUTOPILOT_EVENTS",
        "AUTOPILOT_RESULT",
        "TMPDIR",
        "PYTHONPYCACHEPREFIX",
        "CUDA_VISIBLE_DEVICES",
    }
)
GUARD_VERSION = "1"

# Runs inside the venv's interpreter. It prints nothing: a module may print on import, so
# the findings go to the file named in argv[1].
_PROBE = r"""
import importlib, importlib.util, json, os, site, sys, sysconfig, traceback
out = {"executable": sys.executable, "prefix": sys.prefix, "base_prefix": sys.base_prefix,
       "prefix_real": os.path.realpath(sys.prefix), "path": list(sys.path),
       "user_site": site.USER_SITE if site.ENABLE_USER_SITE else None,
       "cwd": os.getcwd(), "stdlib": [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")],
       "base_site": [p for p in site.getsitepackages() if not p.startswith(sys.prefix)],
       "modules": {}}
wanted = json.loads(sys.argv[2])
for name in wanted["find"] + wanted["import"]:
    try:
        locs = []
        if name in wanted["find"]:
            # the entry is located, not run: its top level is the experiment itself
            spec = importlib.util.find_spec(name)
            if spec is None:
                raise ModuleNotFoundError(f"No module named {name!r}")
            if spec.origin and spec.has_location:
                locs.append(spec.origin)
            elif spec.submodule_search_locations:
                locs.extend(list(spec.submodule_search_locations))
        else:
            mod = importlib.import_module(name)
            if getattr(mod, "__file__", None):
                locs.append(mod.__file__)
            elif getattr(mod, "__path__", None):
                locs.extend(list(mod.__path__))
        out["modules"][name] = {"ok": True, "locations": [os.path.realpath(p) for p in locs]}
    except BaseException as exc:
        out["modules"][name] = {"ok": False, "error": "".join(
            traceback.format_exception_only(type(exc), exc)).strip()}
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class GuardReport:
    ok: bool
    venv: str
    python: str
    cwd: str
    checks: list[Check] = field(default_factory=list)
    modules: dict[str, list[str]] = field(default_factory=dict)
    fingerprint: str | None = None
    cached: bool = False

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        lines = [f"venv    {self.venv}", f"python  {self.python}", f"cwd     {self.cwd}"]
        for c in self.checks:
            lines.append(f"[{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
            if not c.ok and c.fix:
                lines.append(f"       fix: {c.fix}")
        lines.append("PASS" + (" (cached)" if self.cached else "") if self.ok else "FAIL")
        return "\n".join(lines)


def fingerprint(
    *,
    venv: Path,
    python: Path,
    env: Mapping[str, str],
    cwd: Path,
    modules: Sequence[str],
    requirements_hash: str | None,
    sandboxed: bool = False,
    worktree: Path | None = None,
    worktree_commit: str | None = None,
) -> str:
    """What a passing result depends on: the venv's identity, the job's env, cwd and modules.

    With `worktree_commit` (the commit `worktree` is a clean export of), the worktree counts by
    that commit rather than by its path: each job exports to a folder of its own, and without
    this no two jobs of a sweep (one commit, many points) would share a pass."""
    root = Path(os.path.abspath(venv))
    where = os.path.abspath(cwd)
    if worktree is not None and worktree_commit is not None:
        tree = os.path.abspath(worktree)
        env = {k: v.replace(tree, "<worktree>") for k, v in env.items()}
        where = where.replace(tree, "<worktree>")
    parts: dict[str, Any] = {
        "worktree_commit": worktree_commit,
        "v": GUARD_VERSION,
        "venv": str(root),
        "python": str(python),
        "pyvenv_cfg": _read(root / "pyvenv.cfg"),
        "marker": _read(root / COMPLETE_MARKER),
        "requirements_hash": requirements_hash,
        "env": sorted((k, v) for k, v in env.items() if k not in _VOLATILE),
        "cwd": where,
        "modules": list(modules),
        "sandboxed": sandboxed,  # a pass unconfined says nothing of one in the sandbox
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def run_guard(
    venv: Path,
    *,
    env: Mapping[str, str],
    cwd: Path,
    modules: Sequence[str] = (),
    entry: str | None = None,
    worktree: Path | None = None,
    python: Path | None = None,
    requirements_hash: str | None = None,
    cache_dir: Path | None = None,
    timeout_s: float = 120.0,
    policy: bwrap.Policy | None = None,
    cgroup: str = "guard",
    worktree_commit: str | None = None,
) -> GuardReport:
    """Check that `python` (default: the venv's non-resolved interpreter) is the venv.

    `env` and `cwd` must be exactly what the job gets (build them with
    `environment.build_child_env`). `entry` (the module run with `-m`) is located without
    running its top level; `modules` (its declared imports) are imported. Each must come
    from inside the venv, the base install's stdlib (or its site-packages when the venv
    includes system site packages), or the worktree. With `cache_dir`, a pass is
    stored by fingerprint and a second call with the same inputs runs no interpreter (the
    worktree counts by `worktree_commit` where given: a clean export of it). With
    `policy` (the job's sandbox), the probe runs in it, in the cgroup `cgroup`: importing the
    declared modules runs the project's code.
    """
    venv_abs = Path(os.path.abspath(venv))
    report = GuardReport(False, str(venv_abs), str(python or ""), os.path.abspath(cwd))
    try:
        default_python = interpreter_path(venv_abs)
    except VenvError as exc:
        report.checks.append(
            Check(
                "venv", False, str(exc), "build the venv with the launcher, or point at a venv dir"
            )
        )
        return report
    python = python if python is not None else default_python
    report.python = str(python)
    fp = fingerprint(
        venv=venv_abs,
        python=python,
        env=env,
        cwd=cwd,
        modules=[f"entry:{entry}", *modules] if entry else modules,
        requirements_hash=requirements_hash,
        sandboxed=policy is not None,
        worktree=worktree,
        worktree_commit=worktree_commit,
    )
    report.fingerprint = fp
    if cache_dir is not None:
        cached = _load_cached(cache_dir, fp)
        if cached is not None:
            return cached
    wanted = {"find": [entry] if entry else [], "import": [m for m in modules if m != entry]}
    _probe(report, venv_abs, python, env, cwd, wanted, worktree, timeout_s, policy, cgroup)
    report.ok = bool(report.checks) and all(c.ok for c in report.checks)
    if report.ok and cache_dir is not None:
        _store(cache_dir, fp, report)
    return report


def _probe(
    report: GuardReport,
    venv: Path,
    python: Path,
    env: Mapping[str, str],
    cwd: Path,
    wanted: dict[str, list[str]],
    worktree: Path | None,
    timeout_s: float,
    policy: bwrap.Policy | None = None,
    cgroup: str = "guard",
) -> None:
    with tempfile.TemporaryDirectory(prefix="ap-guard-") as tmp:
        out_file = os.path.join(tmp, "probe.json")
        argv = [str(python), "-c", _PROBE, out_file, json.dumps(wanted)]
        try:
            if policy is not None:
                returncode, stderr = _run_sandboxed(argv, policy, Path(tmp), cgroup, timeout_s)
            else:
                proc = subprocess.run(  # noqa: S603 - fixed argv, no shell
                    argv,
                    env=dict(env),
                    cwd=cwd,
                    capture_output=True,
                    timeout=timeout_s,
                    stdin=subprocess.DEVNULL,
                    check=False,
                )
                returncode, stderr = proc.returncode, proc.stderr.decode(errors="replace")
        except (subprocess.TimeoutExpired, SandboxTimeout):
            report.checks.append(
                Check(
                    "interpreter",
                    False,
                    f"{python} did not finish in {timeout_s:.0f} s",
                    "a module hangs on import; run it by hand to see where",
                )
            )
            return
        except OSError as exc:
            report.checks.append(
                Check(
                    "interpreter",
                    False,
                    f"{python} cannot run: {exc}",
                    "the venv is broken: delete it and build it again",
                )
            )
            return
        try:
            with open(out_file) as f:
                found: dict[str, Any] = json.load(f)
        except (OSError, ValueError):
            err = stderr.strip()[-2000:]
            report.checks.append(
                Check(
                    "interpreter",
                    False,
                    f"{python} exited {returncode} without reporting: {err or 'no output'}",
                    "the venv's interpreter is broken: delete the venv and build it again",
                )
            )
            return
    report.checks.append(Check("interpreter", True, f"{found['executable']} runs"))
    _check_prefix(report, venv, found)
    _check_modules(report, venv, found, wanted["find"] + wanted["import"], worktree)


def _run_sandboxed(
    argv: list[str], policy: bwrap.Policy, tmp: Path, cgroup: str, timeout_s: float
) -> tuple[int, str]:
    """The probe in the job's sandbox, which may write only its own findings file besides."""
    log = tmp / "probe.log"
    with_tmp = dataclasses.replace(policy, writable=[*policy.writable, tmp])
    code = confined.run(argv, with_tmp, name=cgroup, timeout_s=timeout_s, log_path=log)
    return code, log.read_text(errors="replace") if log.exists() else ""


def _check_prefix(report: GuardReport, venv: Path, found: Mapping[str, Any]) -> None:
    venv_real = os.path.realpath(venv)
    if found["prefix"] == found["base_prefix"]:
        report.checks.append(
            Check(
                "sys.prefix",
                False,
                f"sys.prefix is the base install {found['prefix']}: this is not the venv's Python",
                f"launch {venv}/bin/python by its absolute, non-resolved path "
                "(never realpath or Path.resolve() it)",
            )
        )
    elif found["prefix_real"] != venv_real:
        report.checks.append(
            Check(
                "sys.prefix",
                False,
                f"sys.prefix is {found['prefix']}, another venv than {venv}",
                f"launch {venv}/bin/python; check pyvenv.cfg in {venv}",
            )
        )
    else:
        report.checks.append(Check("sys.prefix", True, f"{found['prefix']} is the venv"))


def _check_modules(
    report: GuardReport,
    venv: Path,
    found: Mapping[str, Any],
    modules: Sequence[str],
    worktree: Path | None,
) -> None:
    allowed = [os.path.realpath(venv), found["prefix_real"]]
    allowed += [os.path.realpath(p) for p in found["stdlib"]]
    allowed += [os.path.realpath(p) for p in found["base_site"]]  # only there when included
    # ...and, over a base that is itself a venv, that venv's site-packages (venv.py links it)
    allowed += [os.path.realpath(p) for p in venv_mod.inherited_site_dirs(venv)]
    if worktree is not None:
        allowed.append(os.path.realpath(worktree))
    user_site = found.get("user_site")
    for name in modules:
        res = found["modules"].get(name, {"ok": False, "error": "not probed"})
        if not res["ok"]:
            report.checks.append(
                Check(
                    f"import {name}",
                    False,
                    res["error"],
                    "install it into the venv (requirements in autopilot.toml) or check the "
                    "entry module's name and the worktree",
                )
            )
            continue
        locs: list[str] = res["locations"]
        report.modules[name] = locs
        stray = [p for p in locs if not any(_under(p, root) for root in allowed)]
        if user_site:
            stray += [p for p in locs if _under(p, os.path.realpath(user_site)) and p not in stray]
        if stray:
            report.checks.append(
                Check(
                    f"import {name}",
                    False,
                    f"imported from {', '.join(stray)}, outside the venv and the worktree",
                    "remove the stray copy (a file in cwd or the user site shadows the real one) "
                    "and keep PYTHONSAFEPATH=1",
                )
            )
        else:
            where = ", ".join(locs) if locs else "built in"
            report.checks.append(Check(f"import {name}", True, where))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _load_cached(cache_dir: Path, fp: str) -> GuardReport | None:
    try:
        data = json.loads((cache_dir / f"{fp}.json").read_text())
        checks = [Check(**c) for c in data.pop("checks")]
        report = GuardReport(**data, checks=checks)
    except (OSError, ValueError, TypeError):
        return None
    if not report.ok or report.fingerprint != fp:
        return None
    report.cached = True
    return report


def _store(cache_dir: Path, fp: str, report: GuardReport) -> None:
    """Keep a pass. Two preparations of one commit in one worker (its preparer thread and its
    loop) store the same pass at once: each writes a file of its own, then renames it. A pass
    that cannot be kept is probed again next time; it never fails the job."""
    tmp: str | None = None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{fp}.", suffix=".tmp", dir=cache_dir)
        with os.fdopen(handle, "w") as out:
            out.write(json.dumps(report.to_json()))
        os.replace(tmp, cache_dir / f"{fp}.json")
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
