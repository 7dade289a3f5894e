"""A GPU host's preparation of a job, off the demand path (docs/design.md, "Preparation stays off
the GPU's path"): the job's
commit fetched from the forge into this host's mirror cache and exported clean, the project venv
and the preflight guard (in the job's sandbox), all before the job may take a GPU, and all on
the host that will run it (nothing is read from the control host's disk). A GPU worker prepares
ahead while its GPU runs the previous job (`prepare_ahead`), or right away when it is idle.

What the runner needs beyond the job's row (entry, socket budget, preload, requirements hash)
is derived from the project config in the job's source (`launch_settings`), the same config the
preparation read; the job's spec holds only what the experiment reads.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

from app import broker
from app.db import Stores
from app.errors import AutopilotError
from app.git import mirror
from app.git.exceptions import FetchFailed
from app.git.work import GitWork
from app.jobs import gangs, paths, preparation
from app.jobs import service as jobs
from app.projects import command as command_kind
from app.projects import config as project_config
from app.projects import service as projects
from app.redaction import redact_text
from app.settings import Settings
from workers import command_runs, control_client, gang_members
from workers.evaluator import evaluator_dir
from workers.launcher import confine, guard, runtime, venv, venv_build, venv_progress
from workers.launcher.launch import LaunchSpec

log = logging.getLogger(__name__)

HARNESS_DIR = Path(__file__).resolve().parent.parent / "experiments" / "harness"


class PreparationError(RuntimeError):
    pass


@dataclass(frozen=True)
class LaunchSettings:
    """The runner's settings for one experiment of a project, from its `autopilot.toml`."""

    entry: str | None  # None for a command experiment (`workers/command_runs.py` runs it)
    socket_suffix_len: int
    requirements_hash: str
    preload: tuple[str, ...]
    network: bool = False  # the experiment's sandbox keeps the host's network


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
        network=declared.network,
    )


def venvs_root(settings: Settings) -> Path:
    return (settings.venv_root or settings.state_dir).absolute()


#: How many of the jobs in line a preparer looks at when it prepares ahead: it takes the first
#: one no other worker of this host is preparing.
AHEAD_CANDIDATES = 8


def prepare_job(
    stores: Stores,
    settings: Settings,
    job_id: int,
    host: str | None = None,
    *,
    wait: bool = True,
    ring: bool = True,
) -> bool | None:
    """Prepare the job on this host; True when it is ready here and still waits for a GPU.
    With `wait=False`, None (and nothing done) when another worker of this host is preparing
    it now. With `ring=False` no doorbell says it is ready: the caller runs it next."""
    host = host or socket.gethostname()
    folder = paths.job_dir(settings, job_id)
    folder.mkdir(parents=True, exist_ok=True)
    # Workers of this host share the state dir: one prepares, the others find it claimed.
    with open(folder / "prepare.lock", "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        return _prepare_locked(stores, settings, job_id, host, ring=ring)


def prepare_ahead(
    stores: Stores, settings: Settings, queue: str, *, want: int, ring: bool = True
) -> int:
    """Prepare queued jobs of `queue` on this host until `want` wait ready here (or none is
    left to prepare); returns how many became ready now. `ring=False` for an idle worker that
    leases what it prepared next: a doorbell would only wake another worker to find it gone.

    Each GPU worker of a host prepares ahead, kicked at each job's start: they take different
    jobs in line rather than queueing on the first one's lock (one each after the other would
    find it prepared, a few DB round trips each, times the host's GPUs, per job: bench/fleet.py's
    profile); a job another worker is preparing is left to it."""
    host = socket.gethostname()
    made = 0
    while True:
        with stores.ops_session() as session:
            if preparation.ready_on(session, queue, host) >= want:
                return made
            todo = preparation.needs_preparation(session, queue, host, limit=AHEAD_CANDIDATES)
        for job_id in todo:
            done = prepare_job(stores, settings, job_id, host, wait=False, ring=ring)
            if done is not None:
                made += done
                break
        else:  # none left, or each is being prepared by another worker of this host
            return made


def for_idle(stores: Stores, settings: Settings, queue: str, worker: str) -> int:
    """An idle worker found nothing ready here: prepare what it may lease now (no doorbell)."""
    want = want_ready(stores, queue, window=settings.gang_window, idle=worker)
    return prepare_ahead(stores, settings, queue, want=want, ring=False)


def want_ready(
    stores: Stores, queue: str, ahead: int | None = None, *, window: int = 0, idle: str = ""
) -> int:
    """How many jobs this host wants ready: `ahead` (the preparer's, while a GPU runs), or one
    (an idle worker that leased nothing). A job of several GPUs first in line and still waiting
    for them is not what the GPUs that free up meanwhile can run: then `ahead` more than it, or
    one more than are ready (the jobs behind it may backfill). One within `window` of the head
    of the line (`gang_window`) goes first only once prepared here: the host prepares up to it,
    always while a GPU runs, and for an idle worker (`idle`, its name) only when it fits the
    host's free GPUs now (else the GPU would wait on preparations that change nothing)."""
    host = socket.gethostname()
    with stores.ops_session() as session:
        first = jobs.first_waiting(session, queue, host)
        if first is None or first.gpus <= 1:
            to_gang = gangs.ready_for_window(
                session,
                queue=queue,
                window=window,
                host=host,
                asking=idle or None,
                alive=gang_members.alive if idle else None,
            )
            return max(1 if ahead is None else ahead, to_gang)
        if ahead is not None:
            return ahead + 1
        return preparation.ready_on(session, queue, host) + 1


@dataclass(frozen=True)
class _Source:
    project: str
    repo: str
    ref: str
    head_sha: str | None
    experiment: str
    queue: str
    base_sha: str | None = None
    device: str = "cpu"  # what a command's {device} becomes
    head_vs_base: bool = False  # a harness job whose cycle changed code


def _prepare_locked(
    stores: Stores, settings: Settings, job_id: int, host: str, *, ring: bool = True
) -> bool:
    with stores.ops_session() as session:
        # This host's lock for the job is ours, so no live preparer here has it: a row still
        # "preparing" was left by a worker that died mid-preparation.
        job = preparation.claim_preparation(session, job_id, host, preparer_gone=True)
        if job is None:
            return False
        project = projects.find_project_by_id(session, job.project_id)
        assert project is not None
        # A job submitted without a commit (older submitters) runs its project's branch tip.
        source = _Source(
            project=project.name,
            repo=job.repo or project.repo_url,
            ref=job.ref or project.default_branch,
            head_sha=job.head_sha,
            experiment=str(job.experiment),
            queue=job.queue,
            base_sha=job.base_sha or job.head_sha,
            device=command_kind.device_name(str((job.spec or {}).get("device", "cpu"))),
            head_vs_base=bool((job.spec or {}).get("head_vs_base")),
        )
    try:
        tree = export(settings, job_id, source)
        cfg = project_config.load(tree)
        # Kept out of the export before any project code (the guard) runs in it.
        shutil.copyfile(tree / project_config.CONFIG_FILE, paths.launch_config(settings, job_id))
        remove_hidden(tree, cfg.project.hidden)
        experiment = cfg.experiment(source.experiment)
        progress = _venv_progress(stores, settings, job_id, host)
        env = venv_for_job(settings, source.project, requirements(cfg), progress)
        if experiment.kind == "harness":
            _guard(settings, job_id, cfg, tree, env, source)
        if experiment.kind == "command" or source.head_vs_base:
            # Two arms: the base commit's tree beside the head's (the cycle changed code, or a
            # command experiment, which is always judged arm against arm).
            baseline = _baseline(settings, job_id, source, env)
            base_cfg = project_config.load(baseline[0])
            # Hidden at either commit: hidden from both arms (the base's list is the one a
            # candidate cannot change; a head that lists more hides more).
            hidden = list(dict.fromkeys([*cfg.project.hidden, *base_cfg.project.hidden]))
            for arm_tree in (tree, baseline[0]):
                remove_hidden(arm_tree, hidden)
            command_runs.prepare_arms(
                settings,
                job_id,
                experiment,
                candidate=(tree, env, source.head_sha),
                baseline=baseline,
                device=source.device,
                evaluator=_evaluator(settings, job_id, source, baseline, base_cfg),
            )
    except (
        PreparationError,
        command_runs.SetupFailed,
        venv_build.VenvError,
        AutopilotError,
        OSError,
        tarfile.TarError,
    ) as exc:
        message = redact_text(getattr(exc, "detail", None) or str(exc))
        with stores.ops_session() as session:
            ended = preparation.preparation_failed(
                session, settings, job_id, host, f"preparation failed: {message}"
            )
            cycle_id = jobs.cycle_of(session, job_id) if ended else None
        log.warning("job %s: preparation on %s failed: %s", job_id, host, message)
        if cycle_id is not None:  # the job failed: its cycle moves on (after the commit)
            broker.ring_advance(settings, cycle_id)
        return False
    return _ready(stores, settings, job_id, host, tree, env, source.queue if ring else None)


def _venv_progress(
    stores: Stores, settings: Settings, job_id: int, host: str
) -> venv_build.Progress:
    """A venv build's progress, summarised: a line in the job's log on this host (the log its
    run appends to) and this host's preparation row (what the queue page shows)."""

    def emit(status: venv_progress.BuildStatus) -> None:
        try:
            with open(paths.log_path(settings, job_id), "a", encoding="utf-8") as log_file:
                log_file.write(f"[venv] {status.line()}\n")
            with stores.ops_session() as session:
                preparation.record_venv_progress(session, job_id, host, status.as_dict())
        except Exception:  # progress is advisory: a failure to show it never fails the build
            log.warning("job %s: venv progress not recorded", job_id, exc_info=True)

    return venv_progress.BuildSummary(emit)


def _guard(
    settings: Settings,
    job_id: int,
    cfg: project_config.ProjectConfig,
    tree: Path,
    env: venv.Venv,
    source: _Source,
) -> None:
    """The preflight guard of a harness job, in the job's sandbox; PreparationError if it fails.
    A pass is kept per venv, environment and commit: the next job of a sweep skips the probe."""
    experiment = cfg.experiment(source.experiment)
    job_env = guard_env(settings, env, tree)
    report = guard.run_guard(
        env.path,
        env=job_env,
        cwd=tree,
        entry=str(experiment.entry),
        modules=[*experiment.imports, *cfg.project.preload],
        worktree=tree,
        requirements_hash=env.requirements_hash,
        cache_dir=settings.state_dir.absolute() / "guard-cache",
        # The guard imports the project's modules: their code runs as the job's would.
        policy=confine.policy(
            cwd=tree, venv=env.path, env=job_env, network=experiment.network, pythonpath=[tree]
        )
        if settings.sandbox == "on"
        else None,
        cgroup=f"guard-{job_id}{confine.owner_suffix()}",  # one per worker, as a job's
        worktree_commit=source.head_sha,  # None for a job without one: its tree's path counts
    )
    if not report.ok:
        raise PreparationError(report.render())


def _ready(
    stores: Stores,
    settings: Settings,
    job_id: int,
    host: str,
    tree: Path,
    env: venv.Venv,
    ring: str | None,
) -> bool:
    """Mark the job ready on this host; then ring `ring` (its queue), if given."""
    with stores.ops_session() as session:
        ready = preparation.preparation_ready(
            session,
            job_id,
            host,
            workdir=str(tree),
            venv_path=str(env.path),
            environment=env.environment(),
        )
    if ready and ring is not None:
        broker.ring_gpu(settings, ring)  # an idle worker of this host may take it now
    return ready


def _baseline(
    settings: Settings, job_id: int, source: _Source, head_env: venv.Venv
) -> tuple[Path, venv.Venv, str | None]:
    """The baseline arm's tree (the base commit, exported clean beside the candidate's) and its
    venv: the candidate's when the requirements agree, else one of its own."""
    base = _Source(**{**source.__dict__, "head_sha": source.base_sha})
    tree = export(settings, job_id, base, paths.baseline_dir(settings, job_id))
    base_requirements = requirements(project_config.load(tree))
    if venv.requirements_hash(base_requirements) == head_env.requirements_hash:
        return tree, head_env, source.base_sha
    return tree, venv_for_job(settings, source.project, base_requirements), source.base_sha


def remove_hidden(tree: Path, hidden: list[str]) -> None:
    """Remove the project's hidden paths (hold-out data, the evaluator's code) from an export a
    run, its setup or the guard will see: only the evaluator's own tree keeps them. An export is
    ours (made afresh, before any project code ran in it), so no link in it is a run's."""
    for relative in hidden:
        path = tree / relative
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)


def _evaluator(
    settings: Settings,
    job_id: int,
    source: _Source,
    baseline: tuple[Path, venv.Venv, str | None],
    base_cfg: project_config.ProjectConfig,
) -> tuple[tuple[Path, venv.Venv, str | None], project_config.Experiment] | None:
    """The hold-out evaluator's tree: the base commit exported again, hidden paths and all, out
    of every run's reach, with the base commit's declaration of it (a candidate's change to the
    config never chooses its judge). None when the base declares no evaluator."""
    try:
        declared = base_cfg.experiment(source.experiment)
    except AutopilotError:
        return None  # an experiment the head adds: no evaluator the base vouches for
    if not declared.evaluator:
        return None
    base = _Source(**{**source.__dict__, "head_sha": source.base_sha})
    tree = export(settings, job_id, base, evaluator_dir(settings, job_id))
    return (tree, baseline[1], source.base_sha), declared


def export(settings: Settings, job_id: int, source: _Source, dest: Path | None = None) -> Path:
    """The job's commit fetched into this host's mirror cache and exported clean (no .git, no
    bytecode, nothing a previous run or preparation left: an export is made afresh) under this
    host's state dir."""
    work = GitWork(settings)
    sha = source.head_sha
    if (
        sha is not None
        and mirror.holds(work, source.project, sha)
        and control_client.branch_unmoved(settings, source.repo, source.ref, sha)
    ):  # held here, and still the branch's tip on the forge: a fetch would bring nothing
        cache = work.mirror_path(source.project)
    else:
        try:
            cache, sha = mirror.fetch_commit(
                work,
                source.project,
                source.repo,
                source.ref,
                source.head_sha,
                extra_env=control_auth(settings, source.repo),
            )
        except FetchFailed as exc:
            hint = control_client.fetch_refused_hint(settings, source.repo, exc.detail)
            if hint is None:
                raise
            raise FetchFailed(f"{exc.detail}; {hint}") from None
    dest = dest or paths.source_dir(settings, job_id)
    if dest.exists():
        shutil.rmtree(dest)
    return mirror.export(work, cache, sha, dest)


def control_auth(settings: Settings, url: str) -> dict[str, str]:
    """The worker token as an HTTP header for the control host's URLs only (git's
    `http.<url>.extraHeader`): another host never sees it, and it is in no argv or file."""
    token = control_client.control_token(settings, url)
    if token is None:
        return {}
    base = settings.control_url.rstrip("/") + "/"
    return {  # no redirect: git would send the header on to the new host
        "GIT_CONFIG_COUNT": "2",
        "GIT_CONFIG_KEY_0": f"http.{base}.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Bearer {token}",
        "GIT_CONFIG_KEY_1": f"http.{base}.followRedirects",
        "GIT_CONFIG_VALUE_1": "false",
    }


def venv_for_job(
    settings: Settings,
    project: str,
    requirements: list[str],
    progress: venv_build.Progress | None = None,
) -> venv.Venv:
    return venv.ensure_venv(
        venvs_root(settings),
        project,
        requirements,
        system_site_packages=settings.venv_system_site_packages,
        sandboxed=settings.sandbox == "on",
        progress=progress,
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


class Preparer:
    """A GPU worker's background preparer: kicked when a job starts, it prepares this host's
    next jobs (up to `prepare_ahead` ready) while the GPU runs, so the next lease finds its
    export and venv in place (docs/design.md, "Preparation stays off the GPU's path")."""

    def __init__(self, stores: Stores, settings: Settings, queue: str) -> None:
        self.stores, self.settings, self.queue = stores, settings, queue
        self._kicked = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def kick(self) -> None:
        if self.settings.prepare_ahead <= 0 or self._closed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="preparer", daemon=True)
            self._thread.start()
        self._kicked.set()

    def close(self) -> None:
        self._closed = True
        self._kicked.set()

    def _run(self) -> None:
        while True:
            self._kicked.wait()
            self._kicked.clear()
            if self._closed:
                return
            try:
                want = want_ready(
                    self.stores,
                    self.queue,
                    ahead=self.settings.prepare_ahead,
                    window=self.settings.gang_window,
                )
                prepare_ahead(self.stores, self.settings, self.queue, want=want)
            except Exception:  # a preparation error is recorded per job; this is the DB away
                log.warning("preparing ahead on %s failed", self.queue, exc_info=True)
