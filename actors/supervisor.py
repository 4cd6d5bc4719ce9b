"""Self-healing workers: what a restarted actor needs to carry on where its predecessor stopped.

Ray does the restarting (``max_restarts``) and the retrying (``max_task_retries``: the calls that were
queued or running on the dead process run again, in order, on the new one, so the refs the driver already
chained into reward and learner calls simply resolve later). What Ray cannot know is the state the dead
process had built up since its constructor ran: a rollout engine's weights. The new process asks for it from its
constructor (`recover`), so the calls Ray retries on it generate with the policy its predecessor had, never the
initial one.

A restartable group's records live under its name (the ``supervisor`` each worker gets) in the key-value store of
Ray's GCS, which outlives every worker: each rank's restart count and node, and the shared-memory pool a rank loads
its weights from (`remember_pool`; bytes). Refs of object-store buckets cannot be kept there (a ref pickled outside
Ray's calls stays pinned for the cluster's life), so a group whose weights travel through the object store also has
a `Supervisor`, a small actor holding the refs each rank last loaded (`remember`), which the driver starts before
that path's first sync (`WorkerGroup.keep_refs`). A single-node run (shared memory) and reward workers (no weights)
thus run no process for their healing (the default run: 0.6-0.9 CPU s fewer at start-up on 2 cores and a peak of
1237 MiB against 1296, `toolbox bench default_run --steps 400 --rounds 2 --sides toolbox`).

A worker whose node is lost comes back the same way once Ray has moved its placement-group bundle to a node with
room (``tests/e2e/test_multinode.py``); the supervisor actor is pinned to the driver's node, which the run
cannot lose anyway.

Not covered: the state of an actor other than its weights (a restarted worker's RNG stream starts fresh from
its seed) and a dead supervisor actor (it holds no bulk data and runs no user code; its death fails the group's
next restart loudly).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import ray
from ray.experimental import internal_kv as kv  # imported by ray itself: nothing to load

# The records' namespace in the GCS's key-value store; a group's keys start with its name. Ray's own libraries keep
# their cluster-wide records through the same store (`ray.experimental.internal_kv`); it has no public wrapper.
NAMESPACE = "toolbox-healing"


class Supervisor:
    """The object-store bucket refs each rank of a group last loaded."""

    def __init__(self) -> None:
        self.weights: dict[int, list[Any]] = {}

    def loaded(self, rank: int, bucket_refs: list[Any]) -> None:
        """Rank ``rank`` now holds these buckets (refs nested in a list stay refs: nothing is copied here)."""
        self.weights[rank] = bucket_refs

    def weights_of(self, rank: int) -> list[Any] | None:
        """The bucket refs rank ``rank`` last loaded (``None``: none yet)."""
        return self.weights.get(rank)


@functools.cache
def _named(name: str) -> Any:
    return ray.get_actor(name)


def _keeper(name: str) -> Any:
    """The group's `Supervisor` actor, or ``None`` where the group has none (its weights never went through the
    object store)."""
    try:
        return _named(name)
    except ValueError:  # no actor of that name
        return None


def recover(supervisor: str | None, rank: int) -> list[Any] | None:
    """Called by a worker's constructor with its group's name: ``None`` on a first start; after a restart by Ray,
    the restart is recorded with this node and what the dead process had loaded is returned: the pickled pool
    (``[bytes]``), the bucket refs, or ``[]`` for nothing. (A name, not a handle: Ray warns about every restartable
    actor whose constructor gets an actor handle or a ref.)"""
    if supervisor is None:
        return None
    with warnings.catch_warnings():  # Ray's own property reads its deprecated `actor_id`: a warning in every worker log
        warnings.simplefilter("ignore", DeprecationWarning)
        if not ray.get_runtime_context().was_current_actor_reconstructed:
            return None
    from .resolve import node_info

    key = f"{supervisor}/rank/{rank}"
    record = kv._internal_kv_get(key, namespace=NAMESPACE)  # "count node"; only this rank's process writes it
    count = int(record.split()[0]) if record else 0
    kv._internal_kv_put(key, f"{count + 1} {node_info()['node_ip']}".encode(), namespace=NAMESPACE)
    pool = kv._internal_kv_get(f"{supervisor}/pool/{rank}", namespace=NAMESPACE)
    if pool is not None:
        return [pool]
    keeper = _keeper(supervisor)
    return (ray.get(keeper.weights_of.remote(rank)) if keeper is not None else None) or []


def remember(supervisor: str | None, rank: int, bucket_refs: list[Any]) -> None:
    """After a load of object-store buckets: tell the group's supervisor actor (and wait, so a restart right after
    it finds these refs)."""
    if supervisor is not None:
        ray.get(_named(supervisor).loaded.remote(rank, bucket_refs))


def remember_pool(supervisor: str | None, rank: int, pool: bytes) -> None:
    """Once a rank loads from a shared-memory pool: its pickled description, kept in the GCS's store (a restarted
    process attaches to the pool again and loads the generation its predecessor held)."""
    if supervisor is not None:
        kv._internal_kv_put(f"{supervisor}/pool/{rank}", pool, namespace=NAMESPACE)


def restart_records(supervisor: str) -> tuple[int, dict[int, str]]:
    """(restarts so far, node of each restarted rank) of the group named ``supervisor``."""
    prefix = f"{supervisor}/rank/"
    count, nodes = 0, {}
    for key in kv._internal_kv_list(prefix, namespace=NAMESPACE):
        record = kv._internal_kv_get(key, namespace=NAMESPACE)
        if record:
            restarts, node = record.decode().split(" ", 1)
            count += int(restarts)
            nodes[int(key.decode()[len(prefix):])] = node
    return count, nodes


def forget(supervisor: str) -> None:
    """The group's records dropped from the GCS's store (the group is shut down)."""
    kv._internal_kv_del(f"{supervisor}/", del_by_prefix=True, namespace=NAMESPACE)
