"""`Pending`: calls in flight on one worker group, and `wait`: the driver's one wait for several of them.

A group method returns a `Pending` at once; the driver passes it straight to the next
group's method (Ray hands each actor the result it depends on when it is ready), and
waits once per step, on everything it started. Where the handles are values (in-process
groups, tests) waiting is free. This module knows no Ray: the group that made a `Pending`
gives it the `Waiter` that can wait for it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")


class Waiter(Protocol):
    """Waits for handles of one kind (Ray object refs, or values) and fetches their results."""

    def wait(self, pendings: Sequence[Pending[Any]]) -> None:
        """Until every call finished; the first failure or overrun raises a `WorkerError` naming role and rank."""

    def fetch(self, pending: Pending[T]) -> list[T]:
        """The results of finished calls, in call order."""


@dataclass
class Pending(Generic[T]):
    """One call per entry of ``handles`` (an object ref, or the value itself), made on ``ranks`` of ``role``.

    ``bulk`` results (rollout batches) are never fetched by a wait: their readiness is enough, and
    a failure shows in the calls that depend on them (then the wait looks for the root cause).
    """

    handles: list[Any]
    ranks: list[int]
    method: str
    role: str
    nodes: list[str | None]
    timeout_s: float
    waiter: Waiter
    bulk: bool = False
    done: bool = False  # set once a wait saw every call finish
    submitted: float = field(default_factory=time.monotonic)

    def __len__(self) -> int:
        return len(self.handles)

    def node(self, i: int) -> str | None:
        """The node of call ``i``'s worker, for error messages."""
        return self.nodes[self.ranks[i]] if self.ranks[i] < len(self.nodes) else None

    @staticmethod
    def concat(pendings: Sequence[Pending[T]]) -> Pending[T]:
        """Calls of several rounds on one group, as one pending (in order)."""
        first = pendings[0]
        return Pending([h for p in pendings for h in p.handles], [r for p in pendings for r in p.ranks], first.method,
                       first.role, first.nodes, first.timeout_s, first.waiter, first.bulk,
                       submitted=min(p.submitted for p in pendings))

    def result(self) -> list[T]:
        """Their results (waiting first unless a wait already saw them finish)."""
        if not self.done:
            wait(self)
        return self.waiter.fetch(self)

    def keep(self) -> Kept[T]:
        """Their results (fetched, bulk ones too), to hand to later calls after the workers are gone (a checkpoint
        keeps the batches sampled ahead): a group's ``hold`` makes them a `Pending` again."""
        return Kept(self.result(), list(self.ranks), self.method, self.bulk)


@dataclass
class Kept(Generic[T]):
    """Results of finished calls held by value (`Pending.keep`): picklable, so a checkpoint can store them."""

    values: list[T]
    ranks: list[int]
    method: str
    bulk: bool


def deadlines(pendings: Sequence[Pending[Any]]) -> list[float]:
    """When each pending must be done: a stage may start only when the stages before it (in the order given)
    are done, so its budget is its own role's timeout plus those of the roles before it."""
    out, budget, seen = [], 0.0, set()
    for p in pendings:
        if p.role not in seen:
            seen.add(p.role)
            budget += p.timeout_s
        out.append(p.submitted + budget)
    return out


def wait(*pendings: Pending[Any]) -> None:
    """Wait for calls in flight on several groups at once (the driver's one wait per step).

    Pass them in pipeline order (rollout, reward, learner): on an overrun the first call
    still running is blamed, which is the stage that held the others up.
    """
    by_waiter: dict[int, tuple[Waiter, list[Pending[Any]]]] = {}
    for p in pendings:
        by_waiter.setdefault(id(p.waiter), (p.waiter, []))[1].append(p)
    for waiter, group in by_waiter.values():
        waiter.wait(group)
    for p in pendings:
        p.done = True
