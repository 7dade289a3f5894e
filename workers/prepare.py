"""A GPU host's preparation of a job, off the demand path (DESIGN.md, lesson 3): the source
(a fresh checkout for a standalone job), the project venv and the preflight guard, all before
the job may take a GPU. It runs in the `prepare` queue; a prepared job's doorbell then rings.

What the runner needs beyond the job's row (entry, socket budget, preload, requirements hash)
is derived from the project config in the job's source (`launch_settings`), the same config the
preparation read; the job's spec holds only what the experiment reads.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import git

from app import broker
from app.db import Stores
from app.jobs import paths
from app.jobs import service as jobs
from app.projects import config as project_config
from app.projects import service as projects
from app.settings import Settings, redact_text
from workers.launcher import guard, runtime, venv
from workers.launcher.launch import LaunchSpec
from workers.reaper import ring_cycle

HARNESS_DIR = Path(__file__).resolve().parent.parent / "experiments" / "harness"


class PreparationError(RuntimeError):
    pass


@dataclass(frozen=True)
class LaunchSettings:
    """The runner's settings for one experiment of a project, from its `autopilot.toml`."""

    entry: str
    socket_suffix_len: int
    requirements_hash: str
    preload: tuple[str, ...]


def requirements(cfg: project_config.ProjectConfig) -> list[str]:
    """What the project's venv holds: the project's requirements and the harness."""
    return [*cfg.project.python_requirements, str(HARNESS_DIR)]


def launch_settings(cfg: project_config.ProjectConfig, experiment: str) -> LaunchSettings:
    declared = cfg.experiment(experiment)
    return LaunchSettings(
        entry=declared.entry,
        socket_suffix_len=declared.socket_suffix_len,
        requirements_hash=venv.requirements_hash(requirements(cfg)),
        preload=tuple(str(m) for m in cfg.project.preload),
    )


def venvs_root(settings: Settings) -> Path:
    return (settings.venv_root or settings.state_dir).absolute()


def prepare_job(stores: Stores, settings: Settings, job_id: int) -> bool:
    """Make the job ready for a GPU; True when it was prepared now (then its doorbell rings)."""
    folder = paths.job_dir(settings, job_id)
    folder.mkdir(parents=True, exist_ok=True)
    # Duplicate doorbells may arrive at once: one preparer per job, the others find it done.
    with open(folder / "prepare.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _prepare_locked(stores, settings, job_id)


def _prepare_locked(stores: Stores, settings: Settings, job_id: int) -> bool:
    with stores.ops_session() as session:
        job = jobs.awaiting_preparation(session, job_id)
        if job is None:
            return False
        project = projects.find_project_by_id(session, job.project_id)
        assert project is not None
        name, repo_url, branch = project.name, project.repo_url, project.default_branch
        workdir, experiment_name, queue = job.workdir, str(job.experiment), job.queue
    try:
        source = (
            Path(workdir)
            if workdir
            else checkout(repo_url, branch, paths.job_dir(settings, job_id))
        )
        cfg = project_config.load(source)
        experiment = cfg.experiment(experiment_name)
        env = venv_for_job(settings, name, requirements(cfg))
        report = guard.run_guard(
            env.path,
            env=guard_env(settings, env, source),
            cwd=source,
            entry=experiment.entry,
            modules=[*experiment.imports, *cfg.project.preload],
            worktree=source,
            requirements_hash=env.requirements_hash,
            cache_dir=settings.state_dir.absolute() / "guard-cache",
        )
        if not report.ok:
            raise PreparationError(report.render())
    except (PreparationError, venv.VenvError, project_config.ConfigError, git.GitError) as exc:
        message = redact_text(getattr(exc, "detail", None) or str(exc))
        with stores.ops_session() as session:
            jobs.fail_unstarted(session, job_id, f"preparation failed: {message}")
        ring_cycle(settings, stores, job_id)
        return False
    with stores.ops_session() as session:
        prepared = jobs.mark_prepared(session, job_id, workdir=str(source), venv_path=str(env.path))
    if prepared:
        broker.ring_gpu(settings, queue)
    return prepared


def checkout(repo_url: str, branch: str, dest: Path) -> Path:
    """A fresh clone of the project's default branch for a standalone job."""
    target = dest / "src"
    if (target / ".git").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    git.Repo.clone_from(repo_url, target, branch=branch, depth=1, no_hardlinks=True)
    return target


def venv_for_job(settings: Settings, project: str, requirements: list[str]) -> venv.Venv:
    return venv.ensure_venv(
        venvs_root(settings),
        project,
        requirements,
        system_site_packages=settings.venv_system_site_packages,
    )


def guard_env(settings: Settings, env: venv.Venv, source: Path) -> dict[str, str]:
    """The environment the job will get, for the preflight guard (volatile paths excluded)."""
    probe = runtime.allocate_runtime(state_dir=settings.state_dir.absolute(), env=os.environ)
    try:
        spec = LaunchSpec(
            venv=env.path,
            entry="x",
            cwd=source,
            runtime=probe,
            spec={},
            pythonpath=[source],
            base_env=dict(os.environ),
            requirements_hash=env.requirements_hash,
        )
        return spec.env()
    finally:
        runtime.release_runtime(probe)
