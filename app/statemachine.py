"""The one state-machine primitive every lifecycle is written in (a job, a cycle and its step
attempts, a campaign and its steps, a finding, a job's preparation on a host, a local pull
request): each declares its moves as data, who makes each and why, in its domain's
`lifecycle.py`, and changes a row's state only through its `Lifecycle.move`.

A move the table does not hold raises `IllegalMove` (409), one type for every lifecycle, naming
the row and both states; its problem type names the lifecycle (`illegal-job-move`,
`illegal-cycle-move`, ...). A move that races other writers is written by the repository as a
conditional UPDATE from `Lifecycle.guarded`, checked against the same table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from app.errors import Conflict


@dataclass(frozen=True)
class Move:
    """Moves from each of `frm` to each of `to`, who makes them and why they exist."""

    frm: tuple[str, ...]
    to: tuple[str, ...]
    by: str
    why: str


class IllegalMove(Conflict):
    """A move its lifecycle's table does not hold: the row stays as it was."""

    slug = "illegal-move"
    title = "Cannot make that move"

    def __init__(self, kind: str, detail: str, from_state: str, to_state: str) -> None:
        super().__init__(detail, from_state=from_state, to_state=to_state)
        self.kind = kind
        self.slug = f"illegal-{kind.replace(' ', '-')}-move"
        self.title = f"{kind[:1].upper()}{kind[1:]} cannot make that move"

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its own arguments where it is pickled (a Celery task's result).
        return (type(self), (self.kind, self.detail, *self.extra.values()))


@dataclass(frozen=True)
class Guarded:
    """A move made by a conditional UPDATE that races other writers: the repository writes
    `UPDATE ... SET **assign WHERE <attr> IN frm` and learns from the row count whether it won.
    """

    frm: tuple[str, ...]
    to: str
    attr: str

    @property
    def assign(self) -> dict[str, str]:
        return {self.attr: self.to}


class Lifecycle:
    """The states of one kind of row, the moves between them (checked when it is built: every
    state a move names exists, nothing leaves a `final` state) and the one `move` that changes
    a row's state attribute (`attr`: `state`, `status`...). `blank` names the state a NULL
    column stands for (a row not yet decided), where there is one."""

    def __init__(
        self,
        kind: str,
        states: Iterable[str],
        moves: tuple[Move, ...],
        *,
        attr: str = "state",
        final: Iterable[str] = (),
        blank: str | None = None,
    ) -> None:
        self.kind, self.attr, self.blank = kind, attr, blank
        # Plain str values (a StrEnum member is one): what the column holds.
        self.states: tuple[str, ...] = tuple(str(s) for s in states)
        self.final: tuple[str, ...] = tuple(str(s) for s in final)
        self.moves = moves
        known = set(self.states)
        if blank is not None and blank not in known:
            raise ValueError(f"{kind}: the blank state {blank!r} is not one of its states")
        index: dict[tuple[str, str], list[Move]] = {}
        for move in moves:
            if not (move.frm and move.to and move.by and move.why):
                raise ValueError(f"{kind}: a move names no state, no mover or no reason: {move}")
            for frm in move.frm:
                for to in move.to:
                    if frm not in known or to not in known:
                        raise ValueError(f"{kind}: a move names no state of it: {frm} -> {to}")
                    if frm in self.final:
                        raise ValueError(f"{kind}: {frm} is final, yet a move leaves it")
                    index.setdefault((str(frm), str(to)), []).append(move)
        #: (from, to) -> the moves that make it (one, or several made by different movers).
        self.allowed: Mapping[tuple[str, str], tuple[Move, ...]] = MappingProxyType(
            {pair: tuple(found) for pair, found in index.items()}
        )

    def allows(self, frm: str | None, to: str) -> bool:
        """Whether a row in `frm` may move to `to`."""
        return (self._named(frm), str(to)) in self.allowed

    def onward(self, frm: str | None) -> tuple[str, ...]:
        """The states a row in `frm` may move to, sorted."""
        start = self._named(frm)
        return tuple(sorted({to for f, to in self.allowed if f == start}))

    def state_of(self, row: object) -> str:
        """The row's state (its `blank` state where the column is NULL)."""
        return self._named(getattr(row, self.attr))

    def check(self, what: str, frm: str | None, to: str) -> str:
        """`to` as the column holds it, when `what` (the row, in words) may move from `frm` to
        it; else `IllegalMove`, naming both states and where it may go instead."""
        start = self._named(frm)
        if (start, str(to)) not in self.allowed:
            onward = self.onward(start)
            then = (
                f"from {start} it may only become {', '.join(onward)}"
                if onward
                else f"{start} is final"
            )
            detail = f"{what} cannot move from {start} to {to}: {then}"
            raise IllegalMove(self.kind, detail, start, str(to))
        return str(to)

    def move(self, row: object, to: str, **fields: Any) -> None:
        """Move `row` to `to`, setting `fields` with it (its error, its times...); `IllegalMove`,
        naming the row and both states, when the table holds no such move (nothing is set)."""
        if self.attr in fields:
            raise TypeError(f"the {self.attr} is `to`, not a field")
        state = self.check(f"{self.kind} {getattr(row, 'id', None)}", self.state_of(row), to)
        setattr(row, self.attr, None if state == self.blank else state)
        for name, value in fields.items():
            setattr(row, name, value)

    def guarded(self, frm: str | tuple[str, ...], to: str) -> Guarded:
        """The racing form of a move, checked against the table (at import, where a repository
        builds its statement): the states it may start from and the state it sets."""
        starts = (frm,) if isinstance(frm, str) else frm
        for start in starts:
            self.check(f"a {self.kind}", start, to)
        return Guarded(tuple(str(s) for s in starts), str(to), self.attr)

    def _named(self, state: str | None) -> str:
        if state is None and self.blank is not None:
            return self.blank
        return str(state)

    def __repr__(self) -> str:
        return f"Lifecycle({self.kind!r}: {len(self.states)} states, {len(self.moves)} moves)"
