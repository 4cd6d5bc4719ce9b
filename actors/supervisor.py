"""Self-healing workers: what a restarted actor needs to carry on where its predecessor stopped.

Ray does the restarting (``max_restarts``) and the retrying (``max_task_retries``: the calls that were
queued or running on the dead process run again, in order, on the new one, so the refs the driver already
chained into reward and learner calls simply resolve later). What Ray cannot know is the state the dead
process had built up since its constructor ran: a rollout engine's weights. A `Supervisor` (one small actor
per restartable group) keeps, for each rank, the refs of the weight buckets that rank last loaded, and
counts restarts; the new process asks it from its constructor (`recover`), so the calls Ray retries on it
generate with the policy its predecessor had, never the initial one.

A worker whose node is lost comes back the same way once Ray has moved its placement-group bundle to a node with
room (``tests/e2e/test_multinode.py``); the supervisor itself is pinned to the driver's node, which the run
cannot lose anyway.

Not covered: the state of an actor other than its weights (a restarted worker's RNG stream starts fresh from
its seed) and a dead supervisor (it holds no bulk data and runs no user code; its death fails the group's
next restart loudly).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import ray


class Supervisor:
    """Restart count, nodes of restarted ranks, and the weight refs each rank last loaded."""

    def __init__(self) -> None:
        self.restarts = 0
        self.nodes: dict[int, str] = {}
        self.weights: dict[int, list[Any]] = {}

    def restarted(self, rank: int, node: str) -> list[Any] | None:
        """Rank ``rank`` came back on ``node``: counted; returns the bucket refs it had loaded (``None``: none yet)."""
        self.restarts += 1
        self.nodes[rank] = node
        return self.weights.get(rank)

    def loaded(self, rank: int, bucket_refs: list[Any]) -> None:
        """Rank ``rank`` now holds these buckets (refs nested in a list stay refs: nothing is copied here)."""
        self.weights[rank] = bucket_refs

    def report(self) -> tuple[int, dict[int, str]]:
        """(restarts so far, node of each restarted rank)."""
        return self.restarts, dict(self.nodes)


@functools.cache
def _named(name: str) -> Any:
    return ray.get_actor(name)


def recover(supervisor: str | None, rank: int) -> list[Any] | None:
    """Called by a worker's constructor with its group's supervisor's name: ``None`` on a first start; after a
    restart by Ray, the restart is reported and the bucket refs the dead process had loaded are returned (``[]``
    when it had loaded none). (A name, not a handle: Ray warns about every restartable actor whose constructor
    gets an actor handle or a ref.)"""
    if supervisor is None:
        return None
    with warnings.catch_warnings():  # Ray's own property reads its deprecated `actor_id`: a warning in every worker log
        warnings.simplefilter("ignore", DeprecationWarning)
        if not ray.get_runtime_context().was_current_actor_reconstructed:
            return None
    from .resolve import node_info

    return ray.get(_named(supervisor).restarted.remote(rank, node_info()["node_ip"])) or []


def remember(supervisor: str | None, rank: int, bucket_refs: list[Any]) -> None:
    """After a weight load: tell the supervisor (and wait, so a restart right after it finds these refs)."""
    if supervisor is not None:
        ray.get(_named(supervisor).loaded.remote(rank, bucket_refs))
