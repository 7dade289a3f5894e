"""Jobs of several GPUs ("gangs"; docs/design.md, "Jobs of several GPUs").

A job with `gpus = N` runs on N GPUs of one host, all leased at once or none. The worker that
holds each GPU is the unit: the worker that leases the job is its *leader* (it holds the job's
`Lease` and runs its processes with `CUDA_VISIBLE_DEVICES` listing all N), and N - 1 idle
workers of the same host are *seated* (`GangSeat`) in the same transaction, under the leasing
lock. A seated worker leases nothing else until the job ends, so no GPU is double-booked and no
partial hold can deadlock two gangs: either all N are free now, or nothing is taken.

No starvation: the first gang job in line that does not fit yet *reserves* its host. From then
on, a worker of that host takes a one-GPU job behind it only if the job's declared time limit
ends before the gang's GPUs are expected free (the running jobs' starts plus their time limits):
*backfill*. So the gang starts once the jobs running when it reached the head of the line have
ended, however many one-GPU jobs keep arriving. (One reservation per host at a time; a host
with fewer workers of the kind than N never holds it.)

Failure: a seated worker does not heartbeat (it is idle, waiting on its queue), so the leader
checks on each beat that its members' processes are alive (they are on its host). When one is
not, the leader kills the job's processes and gives the job back (`reaping.give_back_gang`):
it is retried like a job whose lease lapsed. A dead leader's lease lapses and the reaper does
the same; its seats go with the lease.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.clock import aware, utcnow
from app.jobs import gang_repository as gang_repo
from app.jobs import repository as repo
from app.jobs.gang_repository import release, seat_of, seated_workers
from app.jobs.lifecycle import ACTIVE
from app.jobs.models import GangSeat, Job, Worker

__all__ = [
    "HostRoom",
    "lost_members",
    "release",
    "seat_of",
    "seated_workers",
    "take_seats",
]

#: Whether a worker's process is alive (its host's pid check, `Worker.pid`).
Alive = Callable[[Worker], bool]


def devices_of(devices: Sequence[str]) -> str:
    """`CUDA_VISIBLE_DEVICES` for a job on these workers' devices (GPU indices, as `--device`
    takes them), in device order."""
    return ",".join(sorted({d for entry in devices for d in entry.split(",") if d}, key=int))


def longest_s(job: Job) -> float:
    """The longest the job may hold its GPUs: every run at its limit (`Experiment.longest_job_s`,
    in its spec), or its own time limit for a job submitted before that was written."""
    value = (job.spec or {}).get("longest_s")
    return float(value) if isinstance(value, int | float) else job.time_limit_s


def _busy(session: Session, host: str) -> dict[str, datetime | None]:
    """Workers of `host` holding a GPU now, with when each expects to be free (its job's start
    plus its time limit; None: unknown, counted as never)."""
    now = utcnow()
    busy: dict[str, datetime | None] = {}
    for worker, job, seated in gang_repo.holders_on(session, host):
        # A reservation (a reserved job's lease, never a seat) frees its worker only after its
        # current job and itself: unknown here.
        end = _expected_end(job, now) if seated or job.state in ACTIVE else None
        previous = busy.get(worker, now)
        busy[worker] = None if end is None or previous is None else max(end, previous)
    return busy


def _expected_end(job: Job, now: datetime) -> datetime:
    since = aware(job.started_at) or aware(job.leased_at) or now
    return since + timedelta(seconds=longest_s(job))


@dataclass
class HostRoom:
    """What one host can give jobs now, seen by the worker `asking` (free itself: it is
    choosing its next job), under the leasing lock."""

    asking: str
    free: list[Worker]  # idle workers of the kind besides `asking`, in device order
    capacity: int  # live workers of the kind on the host, `asking` included
    busy_until: list[datetime | None]  # when each busy worker expects to be free

    @classmethod
    def of(cls, session: Session, *, host: str, kind: str, asking: str, alive: Alive) -> HostRoom:
        live = [w for w in gang_repo.workers_on(session, host, kind) if alive(w)]
        busy = _busy(session, host)
        free = [w for w in live if w.name != asking and w.name not in busy]
        free.sort(key=lambda w: (len(w.devices), w.devices, w.name))
        names = {w.name for w in live}
        until = [end for name, end in busy.items() if name in names and name != asking]
        capacity = len(live) + (0 if asking in names else 1)
        return cls(asking, free, capacity, until)

    def fits(self, gpus: int) -> bool:
        return len(self.free) + 1 >= gpus

    def ready_at(self, gpus: int) -> datetime | None:
        """When `gpus` GPUs of this host are expected free, by the declared time limits of what
        runs; None when the host cannot hold that many or a holder's end is unknown."""
        short = gpus - 1 - len(self.free)
        if short <= 0:
            return utcnow()
        if gpus > self.capacity:
            return None
        ends = sorted(self.busy_until, key=lambda e: (e is None, e))
        needed = ends[short - 1] if len(ends) >= short else None
        return needed


def take_seats(session: Session, job: Job, room: HostRoom, *, host: str, leader_device: str) -> str:
    """Seat the job's N - 1 members from the host's free workers (the caller has checked that
    they fit); the job's devices, leader's first in device order, as CUDA_VISIBLE_DEVICES."""
    members = room.free[: job.gpus - 1]
    for worker in members:
        repo.add(
            session, GangSeat(job_id=job.id, worker=worker.name, host=host, device=worker.devices)
        )
    return devices_of([leader_device, *(w.devices for w in members)])


def lost_members(session: Session, job_id: int, alive: Alive) -> list[str]:
    """The job's seated workers whose process is gone (their GPUs may be anyone's)."""
    names = [seat.worker for seat in gang_repo.seats(session, job_id)]
    if not names:
        return []
    rows = {w.name: w for w in gang_repo.workers_named(session, names)}
    return [name for name in names if name not in rows or not alive(rows[name])]


#: The host's room, read on first use (`service.choose_next` meets a job of several GPUs).
RoomOf = Callable[[], HostRoom]


class Line:
    """The waiting line as one worker walks it (`service.choose_next`): which job it may take,
    given what its host has free, and why the others it passed wait."""

    def __init__(self, host: str, room: RoomOf | None, window: int = 0) -> None:
        self.host, self.room = host, room
        self.window = window  # `gang_ahead`'s (settings.gang_window)
        self.reserved_for: Job | None = None  # the gang job first in line that does not fit
        self.ready_at: datetime | None = None  # when its GPUs are expected free
        self.stopped = False  # nothing further may be taken (a worker reserving its next job)
        self.reasons: dict[int, str] = {}

    def admits(self, job: Job) -> bool:
        if job.gpus > 1:
            return self._gang(job)
        if self.reserved_for is None:
            return True
        if (
            self.ready_at is not None
            and utcnow() + timedelta(seconds=longest_s(job)) <= self.ready_at
        ):
            return True  # backfill: done before the reservation is needed
        self.reasons[job.id] = (
            f"held: {self.host}'s GPUs are reserved for job {self.reserved_for.id} "
            f"({self.reserved_for.gpus} GPUs), and this job's time limit "
            f"({longest_s(job):g} s) ends after they are expected free"
        )
        return False

    def gang_ahead(self, job: Job, ahead: Sequence[Job]) -> Job | None:
        """The job of several GPUs among the next `window` in line from `job` (a one-GPU job
        this worker may take) that fits the host now, if any: it goes first (`job` and the
        ones between wait for the next free GPU). Only the first such job is asked, so jobs of
        several GPUs keep their own order, and a one-GPU job is passed at most by the jobs
        within the window behind it.

        A worker reserving its next job (no room: its own GPU is busy) reserves `job`: were
        GPUs to free up before it ends, an idle worker takes the reservation over
        (`service.lease_next`)."""
        if job.gpus > 1 or self.reserved_for is not None or self.window < 2 or self.room is None:
            return None
        behind = next((j for j in ahead[: self.window - 1] if j.gpus > 1), None)
        if behind is None:
            return None
        room = self.room()
        if behind.gpus > room.capacity or not room.fits(behind.gpus):
            return None
        self.reasons[job.id] = (
            f"passed by job {behind.id} ({behind.gpus} GPUs), close behind it in line, which "
            f"fits {self.host} now"
        )
        return behind

    def _gang(self, job: Job) -> bool:
        if self.room is None:  # reserving a next job: never a gang, nor anything behind one
            self.stopped = True
            return False
        room = self.room()
        if job.gpus > room.capacity:
            self.reasons[job.id] = (
                f"needs {job.gpus} GPUs on one host; {self.host} has {room.capacity} of its kind"
            )
            return False
        if self.reserved_for is not None:
            self.reasons[job.id] = (
                f"waits behind job {self.reserved_for.id}, which holds {self.host}'s reservation"
            )
            return False
        if room.fits(job.gpus):
            return True
        self.reserved_for, self.ready_at = job, room.ready_at(job.gpus)
        expected = (
            f"expected free by {self.ready_at:%H:%M:%S} UTC (the running jobs' time limits)"
            if self.ready_at is not None
            else "expected free when the jobs holding them end"
        )
        self.reasons[job.id] = (
            f"waiting for {job.gpus} GPUs on {self.host}: {len(room.free) + 1} free now; "
            f"{self.host} is reserved for it, {expected}"
        )
        return False


def room_on(session: Session, *, queue: str, host: str, worker: str, alive: Alive | None) -> RoomOf:
    """What the host has free for a job of several GPUs, read once and only when one is met."""
    seen: list[HostRoom] = []

    def room() -> HostRoom:
        if not seen:
            seen.append(
                HostRoom.of(
                    session,
                    host=host,
                    kind=queue.removeprefix("gpu."),
                    asking=worker,
                    alive=alive or (lambda _: False),
                )
            )
        return seen[0]

    return room


def ready_for_window(
    session: Session,
    *,
    queue: str,
    window: int,
    host: str,
    asking: str | None = None,
    alive: Alive | None = None,
) -> int:
    """How many jobs at the head of the line a host prepares so that `Line.gang_ahead` can see
    the job of several GPUs within `window` of it (a job is only leased, or passed, once it is
    prepared on the host): its place in line plus one, or 0 when there is none.

    `asking` and `alive` (an idle worker, whose GPU waits while it prepares): only when the job
    fits the host's free GPUs now, for otherwise it would not go first anyway."""
    if window < 2:
        return 0
    line = list(gang_repo.gpus_in_line(session, queue, window))
    at = next((i for i, gpus in enumerate(line) if (gpus or 1) > 1), None)
    if at is None or at == 0:  # none, or first in line: the reservation's case
        return 0
    if asking is not None and alive is not None:
        room = room_on(session, queue=queue, host=host, worker=asking, alive=alive)
        if not room().fits(line[at] or 1):
            return 0
    return at + 1


def lease_devices(session: Session, job_id: int) -> str:
    """The devices the job's lease holds (a gang's: its leader's and its members')."""
    lease = repo.lease_of(session, job_id)
    return lease.device if lease is not None else ""
