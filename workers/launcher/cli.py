"""`autopilot doctor`: check a venv with the preflight guard, show the runtime dir choice."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from workers import gpu_host
from workers.launcher import environment, guard, runtime
from workers.launcher.venv import COMPLETE_MARKER

doctor_app = typer.Typer(
    help="Check what a launch depends on: the project venv, the runtime dir, a GPU host's "
    "settings.",
    no_args_is_help=True,
)


def _state_dir() -> Path:
    from app.settings import Settings

    return Settings().state_dir


def _echo(text: str) -> None:
    typer.echo(text)


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise typer.BadParameter(f"{pair!r} is not K=V", param_hint="--env")
        env[name] = value
    return env


@doctor_app.command("venv")
def doctor_venv(
    path: Annotated[Path, typer.Argument(help="The venv directory (not resolved).")],
    entry: Annotated[
        str | None,
        typer.Option("--entry", help="The experiment's entry module (located, not run)."),
    ] = None,
    module: Annotated[
        list[str] | None,
        typer.Option("--module", help="A declared import of the job (imported); repeatable."),
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="An extra job variable K=V; repeatable.")
    ] = None,
    cwd: Annotated[
        Path | None,
        typer.Option(help="The job's working dir and worktree (on PYTHONPATH); default: here."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run the preflight guard with the job's environment; exit 0 on pass, 1 on failure."""
    workdir = Path(os.path.abspath(cwd if cwd is not None else Path.cwd()))
    try:
        extra = environment.validate_extra(_parse_env(env or []))
    except environment.EnvError as exc:
        _fail(as_json, str(exc))
    venv = Path(os.path.abspath(path))
    rt = runtime.allocate_runtime(state_dir=_state_dir(), env=os.environ, need_exec=False)
    try:
        req_hash = None
        marker = venv / COMPLETE_MARKER
        if marker.is_file():
            req_hash = json.loads(marker.read_text()).get("requirements_hash")
        child_env = environment.build_child_env(
            base_env=os.environ,
            venv=venv,
            runtime_dir=rt.path,
            events_path=rt.events_path,
            result_path=rt.path / "result.json",
            spec_path=rt.path / "spec.json",
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            pythonpath=[workdir],
            requirements_hash=req_hash,
            extra=extra,
        )
        report = guard.run_guard(
            venv,
            env=child_env,
            cwd=workdir,
            entry=entry,
            modules=module or [],
            worktree=workdir,
            requirements_hash=req_hash,
        )
    finally:
        runtime.release_runtime(rt)
    _echo(json.dumps(report.to_json(), indent=2) if as_json else report.render())
    raise typer.Exit(0 if report.ok else 1)


@doctor_app.command("runtime")
def doctor_runtime(
    suffix_len: Annotated[
        int, typer.Option(help="Bytes the job's libraries append to TMPDIR for their sockets.")
    ] = runtime.DEFAULT_SUFFIX_LEN,
    need_exec: Annotated[
        bool,
        typer.Option(
            "--need-exec/--no-need-exec", help="Whether the job needs exec in its runtime dir."
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the choice as JSON.")] = False,
) -> None:
    """Show the runtime dir a job would get, its longest socket path, and why others lost."""
    state_dir = _state_dir()
    roots = runtime.candidate_roots(os.environ, state_dir)
    try:
        rt = runtime.allocate_runtime(
            state_dir=state_dir, env=os.environ, suffix_len=suffix_len, need_exec=need_exec
        )
    except runtime.RuntimeDirError as exc:
        cands = runtime.survey(roots, suffix_len, need_exec) if suffix_len >= 0 else []
        _fail(as_json, str(exc), candidates=[_cand(c) for c in cands])
    try:
        bound = runtime.probe_bind(rt)
        info: dict[str, Any] = {
            "ok": True,
            "runtime_dir": str(rt.path),
            "longest_socket_path": bound,
            "longest_socket_len": rt.longest_final_len,
            "budget": rt.budget,
            "suffix_len": rt.suffix_len,
            "events_socket": str(rt.events_path),
            "need_exec": need_exec,
            "alias": None
            if rt.alias is None
            else {
                "path": str(rt.alias.path),
                "target": str(rt.alias.target),
                "reason": rt.alias_reason,
            },
            "candidates": [_cand(c, chosen=c.root == _root_of(rt)) for c in rt.candidates],
        }
    finally:
        runtime.release_runtime(rt)
    if as_json:
        _echo(json.dumps(info, indent=2))
        raise typer.Exit(0)
    _echo(f"runtime dir   {info['runtime_dir']}  (removed again; each job gets a fresh one)")
    _echo(f"longest path  {info['longest_socket_path']}")
    _echo(
        f"              {info['longest_socket_len']} of {info['budget']} bytes "
        f"(suffix {suffix_len}; a real bind on it succeeded)"
    )
    if rt.alias is None:
        _echo("alias         none")
    else:
        _echo(f"alias         {rt.alias.path} -> {rt.alias.target}: {rt.alias_reason}")
    for c in info["candidates"]:
        why = "chosen" if c["chosen"] else c["passed_over"] or "usable, not needed"
        _echo(f"  {c['source']:<22} {c['root']}: {why}")
    raise typer.Exit(0)


@doctor_app.command("gpu-host")
def doctor_gpu_host(
    kind: Annotated[
        str | None, typer.Option(help="This host's GPU kind (AUTOPILOT_GPU_KIND): checked too.")
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help="With --kind: this host's workers' GPUs (e.g. 0,1): nodes checked too."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Check a GPU host's settings against the real services; exit 0 when all pass, else 1.

    The GPU workers' own start checks are among them: Kubernetes' readiness probe and the Slurm
    script's preflight run this command (deploy/)."""
    checks = gpu_host.run_checks(kind, device)
    ok = all(c.ok for c in checks)
    if as_json:
        _echo(json.dumps({"ok": ok, "checks": [c.to_json() for c in checks]}, indent=2))
        raise typer.Exit(0 if ok else 1)
    for check in checks:
        _echo(check.line())
    failed = sum(not c.ok for c in checks)
    _echo(f"{len(checks)} checks, all passed" if ok else f"{failed} of {len(checks)} checks failed")
    raise typer.Exit(0 if ok else 1)


def _root_of(rt: runtime.RuntimeDir) -> str:
    return os.path.dirname(str(rt.target))


def _cand(c: runtime.Candidate, chosen: bool = False) -> dict[str, Any]:
    return {
        "chosen": chosen,
        "source": c.source,
        "root": c.root,
        "final_len": c.final_len,
        "usable": c.usable,
        "fits": c.fits,
        "exec": c.exec_ok,
        "passed_over": c.reason,
    }


def _fail(as_json: bool, message: str, **extra: Any) -> typer.Exit:  # noqa: ANN401
    if as_json:
        _echo(json.dumps({"ok": False, "error": message, **extra}, indent=2))
    else:
        typer.echo(message, err=True)
    raise typer.Exit(1)


if __name__ == "__main__":
    sys.exit(doctor_app())
