"""A cycle's base is the commit its plan read `autopilot.toml` at (issue 18): prepare makes the
cycle's branch there without fetching again, and the local forge names a sweep's candidate (the
base itself) with one ref update instead of a push."""

from __future__ import annotations

from pathlib import Path

import git as gitpython
import pytest

from app.cycles import service
from app.cycles.exceptions import CycleNotFound
from app.cycles.machine import Machine
from app.cycles.steps.plan import Plan
from app.cycles.steps.prepare import Prepare
from app.db import Stores
from app.forge.base import ProjectRef
from app.forge.local import LocalForge
from app.jobs import service as jobs
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.forge.gitrepo import git
from tests.integration.queue.conftest import make_repo


def test_a_sweep_runs_at_the_base_its_plan_read(
    stores: Stores, settings: Settings, tmp_path: Path
) -> None:
    upstream = make_repo(tmp_path, "pinned")
    with stores.ops_session() as session:
        project = ops.create_project(session, ProjectCreate(name="pinned", repo_url=str(upstream)))
        ref = ProjectRef.of(project)
        cycle_id = service.create(session, service.Trigger(project="pinned"))[0].id
    read_at = git(upstream, "rev-parse", "main")

    assert Plan(stores, settings).run(cycle_id)
    with stores.ops_session() as session:
        planned = service.get(session, cycle_id)
        assert (planned.state, planned.base_sha) == ("preparing", read_at)

    # The base moves on the forge between the plan and the prepare.
    repo = gitpython.Repo(upstream)
    (upstream / "NEWS.md").write_text("moved\n")
    repo.index.add(["NEWS.md"])
    actor = gitpython.Actor("t", "t@example.invalid")
    moved = repo.index.commit("moved", author=actor, committer=actor).hexsha
    forge = LocalForge(settings, stores)
    forge.sync_base(ref)
    bare = Path(forge.remote_url(ref))
    assert git(bare, "rev-parse", "main") == moved

    assert Prepare(stores, settings).run(cycle_id)
    with stores.ops_session() as session:
        cycle = service.get(session, cycle_id)
        job = jobs.for_cycle(session, cycle_id)
        assert cycle.state == "queued" and cycle.base_sha == read_at
        assert job is not None and (job.head_sha, job.base_sha) == (read_at, read_at)
        branch = str(cycle.branch)
    # On the forge for the GPU hosts to fetch: named at the base, not pushed.
    assert git(bare, "rev-parse", f"refs/heads/{branch}") == read_at


def test_the_local_forge_places_a_branch_only_at_a_commit_it_holds(
    stores: Stores, settings: Settings, tmp_path: Path
) -> None:
    upstream = make_repo(tmp_path, "placed")
    ref = ProjectRef("placed", str(upstream), "main")
    forge = LocalForge(settings, stores)
    bare = Path(forge.remote_url(ref))
    base = git(bare, "rev-parse", "main")

    assert forge.place_branch(ref, "autopilot/placed/1-sweep", base)
    assert git(bare, "rev-parse", "refs/heads/autopilot/placed/1-sweep") == base
    # A commit the forge does not hold needs a push; so does a branch that exists already.
    assert not forge.place_branch(ref, "autopilot/placed/2-sweep", "f" * 40)
    assert not forge.place_branch(ref, "autopilot/placed/1-sweep", base)
    tree = git(bare, "rev-parse", "main^{tree}")
    assert not forge.place_branch(ref, "autopilot/placed/3-sweep", tree)
    heads = git(bare, "for-each-ref", "--format=%(refname)", "refs/heads/autopilot")
    assert heads.split() == ["refs/heads/autopilot/placed/1-sweep"]


@pytest.mark.stores("sqlite", "postgres")  # PostgreSQL's integer column is 32 bits
@pytest.mark.parametrize("cycle_id", [0, 2**31, 10**12])
def test_the_machine_names_a_cycle_id_past_the_column(
    stores: Stores, settings: Settings, cycle_id: int
) -> None:
    """Past the 32-bit column PostgreSQL would raise on the value: it names no cycle."""
    with pytest.raises(CycleNotFound, match=f"no cycle {cycle_id}"):
        Machine(stores, settings).advance(cycle_id)
