"""Worker groups: N actors of one role in a placement group, with every call bounded by a timeout.

`WorkerGroup` (Ray) and `LocalGroup` (in-process, for tests and ``ray.local_mode``)
share one interface, which the typed role facades in `toolbox.actors.roles` build on.
A call names the worker's method itself, never its name as a string, and each call's
arguments are an `Args` checked against that method, so the type checker holds the
arguments and the result type together, and a reader follows a call to the method it runs:

- ``submit(RolloutWorker.generate, [Args(shard, sampling) for shard in shards], ranks)``
  starts one call per `Args` (rank ``ranks[i]``, default ``i`` modulo the group size) and
  returns a `Pending` of the method's result type;
- ``each(LearnerWorker.save, path)``: the same call on every worker;
- `toolbox.core.pending.wait` waits for pendings of several groups at once, and
  ``Pending.result()`` fetches one's results;
- ``call`` is submit + result;
- ``submit_parts`` is submit for a method returning a tuple: one pending per part.

An argument may be another call's pending handle (an object ref): Ray starts the call
when that result is ready, so calls chain without the driver waiting in between.
Workers return their bulk results themselves (Ray stores them; the driver holds refs).
A call that overruns its role's timeout, or an actor that dies or raises, becomes a
`WorkerError` naming the role, the rank and the node: the run fails loudly instead of
hanging (`toolbox.actors.calls` waits and names the failure).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Generic

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from toolbox.core.errors import WorkerError
from toolbox.core.pending import Kept, Pending, T

from .calls import (
    LOCAL_WAITER,
    RAY_WAITER,
    Args,
    LocalFailure,
    Method,
    P,
    R,
    W,
    failed_input,
    method_name,
    plan_calls,
)
from .supervisor import Supervisor, forget, restart_records


def reserve(bundle: dict[str, float], n: int, strategy: str, timeout_s: float,
            unscheduled: Callable[[], Exception]) -> PlacementGroup:
    """A placement group of ``n`` x ``bundle``, scheduled within ``timeout_s``; otherwise it is removed and
    ``unscheduled()`` raised (called then, so its message can say what is free at that moment)."""
    pg = placement_group([bundle] * n, strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except GetTimeoutError:
        remove_placement_group(pg)
        raise unscheduled() from None
    return pg


class WorkerGroup(Generic[W]):
    """``num_workers`` Ray actors of ``cls`` for one ``role``, placed in one placement group."""

    def __init__(self, role: str, cls: type[W], num_workers: int, make_kwargs: Callable[[int], dict[str, Any]],
                 timeout_s: float, cpus: float = 1.0, gpus: float = 0.0, env: dict[str, str] | None = None,
                 placement_timeout_s: float = 60.0, placement: tuple[PlacementGroup, int] | None = None,
                 resources: dict[str, float] | None = None, strategy: str = "PACK", max_restarts: int = 0,
                 wait: bool = True) -> None:
        """``placement=(pg, first)`` puts the actors in bundles ``first..first+n-1`` of an existing placement
        group (a Tune trial's); otherwise the group reserves a placement group of its own with ``strategy``.
        ``resources``: custom Ray resources each actor needs (in its bundle too).

        ``max_restarts > 0`` makes the workers self-healing: Ray restarts a dead one (up to that many times in
        all, per worker) and runs its unfinished calls again on the new process, which gets a ``supervisor``
        keyword (the name the group's records go under, `toolbox.actors.supervisor`) to recover what its
        predecessor had loaded. Past the bound, a call on the dead worker fails as without restarts.

        ``wait=False`` returns as soon as the actors are created, their constructors (model loading) still
        running, so several groups start at once; `started` waits for them (calls may be submitted before)."""
        self.role, self.timeout_s, self.cls = role, timeout_s, cls
        self.nodes: list[str | None] = [None] * num_workers
        self.owns_pg = placement is None
        self.resources = dict(resources or {})
        if placement is None:
            self.pg, first = self._reserve(num_workers, cpus, gpus, placement_timeout_s, strategy), 0
        else:
            self.pg, first = placement
        name = f"toolbox-supervisor-{role}-{uuid.uuid4().hex[:12]}" if max_restarts else ""
        healing = {"supervisor": name} if name else {}
        remote_cls = ray.remote(cls)
        self.start_s = max(timeout_s, placement_timeout_s)  # start-up (model loading): the longer of the two budgets
        self.spawn = lambda i: remote_cls.options(
            num_cpus=cpus, num_gpus=gpus, resources=self.resources,
            max_restarts=max_restarts, max_task_retries=-1 if max_restarts else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, first + i),
            # No env to add: no runtime env, so Ray may hand the actor a worker process it started ahead
            **({"runtime_env": {"env_vars": env}} if env else {}),
        ).remote(**make_kwargs(i), **healing)
        self.actors = [self.spawn(i) for i in range(num_workers)]
        self.supervisor_name, self.supervisor = name, None  # the actor: `keep_refs`
        self.replacements, self.max_replacements = 0, 0  # `replace_all`: times done, times allowed
        self.on_replace: Callable[[WorkerGroup[W]], None] | None = None  # sets new workers up as at start
        self._ready: Pending[Any] | None = None
        if wait:
            self._started()
        else:
            self._submit_ready()

    def _submit_ready(self) -> None:
        # Every worker class has ``ready`` (`toolbox.actors.resolve.node_info`); the group knows no common base.
        self._ready = self._submit("ready", [Args()] * len(self.actors), None, self.start_s, False)

    def _started(self) -> None:
        self._submit_ready()
        self.started()

    def started(self) -> WorkerGroup[W]:
        """Wait (once) until every actor's constructor is done; record the node and bundle each runs in."""
        if self._ready is None:
            return self
        infos, self._ready = self._ready.result(), None
        self.nodes[:] = [info.get("node_ip") for info in infos]  # in place: pendings name nodes from this list
        self.node_ids = [info.get("node_id") for info in infos]
        # (placement group id, bundle index) each actor reports it runs in (`toolbox.actors.resolve.placement_info`)
        self.bundles = [(info.get("placement_group"), info.get("bundle")) for info in infos]
        return self

    def replace_all(self) -> bool:
        """Kill every worker and start new ones in the same bundles with the same arguments, then run
        ``on_replace`` (for ranks that only work together, like learner ranks in one process group: one cannot
        come back alone). ``False`` (nothing done) once ``max_replacements`` are spent."""
        if self.replacements >= self.max_replacements:
            return False
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = [self.spawn(i) for i in range(len(self.actors))]
        self.replacements += 1
        self._started()
        if self.on_replace is not None:
            self.on_replace(self)
        return True

    def _reserve(self, n: int, cpus: float, gpus: float, timeout_s: float, strategy: str) -> PlacementGroup:
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **self.resources}
        return reserve(bundle, n, strategy, timeout_s, lambda: WorkerError(
            self.role, -1, None, f"placement group of {n} x {bundle} was not scheduled within "
            f"{timeout_s}s; free: {ray.available_resources().get('CPU', 0):.2f} of "
            f"{ray.cluster_resources().get('CPU', 0):.2f} CPUs (lower {self.role}.cpus_per_worker "
            f"or add nodes{self._missing_resources()})"))

    def _missing_resources(self) -> str:
        missing = sorted(k for k in self.resources if k not in ray.cluster_resources())
        return f"; no node offers the custom resources {missing} of ray.placement.{self.role}" if missing else ""

    def __len__(self) -> int:
        return len(self.actors)

    def submit(self, method: Method[W, P, R], calls: Sequence[Args[P]], ranks: Sequence[int] | None = None,
               timeout_s: float | None = None, bulk: bool = False) -> Pending[R]:
        """One call of ``method`` per entry of ``calls``, on rank ``ranks[i]`` (default ``i`` modulo the group)."""
        return self._submit(method_name(method, self.cls), calls, ranks, timeout_s, bulk)

    def _submit(self, name: str, calls: Sequence[Args[Any]], ranks: Sequence[int] | None, timeout_s: float | None,
                bulk: bool) -> Pending[Any]:
        args, targets = plan_calls(calls, ranks, len(self.actors))
        refs = [getattr(self.actors[r], name).remote(*a.args, **a.kwargs) for r, a in zip(targets, args)]
        return Pending(refs, targets, name, self.role, self.nodes, timeout_s or self.timeout_s, RAY_WAITER, bulk)

    def each(self, method: Method[W, P, R], *args: P.args, **kwargs: P.kwargs) -> Pending[R]:
        """The same call of ``method`` on every worker, in rank order."""
        return self.submit(method, [Args(*args, **kwargs)] * len(self.actors))

    def submit_parts(self, method: Method[W, P, Any], calls: Sequence[Args[P]], parts: int,
                     bulk: bool = False) -> list[Pending[Any]]:
        """Like `submit`, for a method that returns a tuple of ``parts`` results: Ray stores each part as an object
        of its own (``num_returns``), so each may be passed on alone. One pending per part."""
        name = method_name(method, self.cls)
        args, targets = plan_calls(calls, None, len(self.actors))
        started = [getattr(self.actors[r], name).options(num_returns=parts).remote(*a.args, **a.kwargs)
                   for r, a in zip(targets, args)]
        refs = [c if parts > 1 else [c] for c in started]  # one return: Ray hands back the ref itself
        return [Pending([r[j] for r in refs], targets, name, self.role, self.nodes, self.timeout_s, RAY_WAITER, bulk)
                for j in range(parts)]

    def call(self, method: Method[W, P, R], calls: Sequence[Args[P]], ranks: Sequence[int] | None = None,
             timeout_s: float | None = None) -> list[R]:
        return self.submit(method, calls, ranks, timeout_s).result()

    def hold(self, kept: Kept[T]) -> Pending[T]:
        """Results kept by value (`Pending.keep`), put in the object store: later calls take them as they take the
        refs of this group's own calls."""
        refs = [ray.put(v) for v in kept.values]
        return Pending(refs, kept.ranks, kept.method, self.role, self.nodes, self.timeout_s, RAY_WAITER, kept.bulk)

    def keep_refs(self) -> None:
        """Before the workers first load object-store buckets: a self-healing group's `Supervisor` actor, which
        keeps the refs each rank loaded for its restart (started once; a group without restarts needs none)."""
        if self.supervisor_name and self.supervisor is None:
            self.supervisor = _start_supervisor(self.supervisor_name)

    def restarts(self) -> int:
        """Restarts so far: of one worker by Ray (restarted ranks' nodes are refreshed), of all by `replace_all`."""
        if not self.supervisor_name:
            return self.replacements
        count, nodes = restart_records(self.supervisor_name)
        for rank, node in nodes.items():
            self.nodes[rank] = node  # the list every Pending of this group names nodes from
        return int(count) + self.replacements

    def shutdown(self) -> None:
        for actor in self.actors + ([self.supervisor] if self.supervisor is not None else []):
            ray.kill(actor, no_restart=True)
        if self.supervisor_name:
            forget(self.supervisor_name)
        if self.owns_pg:
            remove_placement_group(self.pg)


def _start_supervisor(name: str) -> Any:
    """A group's `Supervisor` named ``name`` on the driver's node (it must outlive the workers it helps), outside
    any placement group (it reserves no CPU)."""
    # Hard affinity: a soft one with no resources asked lets Ray pick any node (ray-project/ray#25360 fixed only the
    # hard case), and a supervisor on a worker's node dies with it, failing the very restart it is there for.
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(Supervisor).options(name=name, num_cpus=0, scheduling_strategy=here).remote()


class LocalGroup(Generic[W]):
    """In-process stand-in for `WorkerGroup`: same methods; calls run eagerly in ``submit``, and one that raises
    fails its `Pending` (the wait raises it; a call given its result fails with the same error, unrun). The workers
    may be test fakes that have the methods called by name, not the class they come from."""

    timeout_s = 0.0  # calls run eagerly at submit: no deadline

    def __init__(self, role: str, workers: Sequence[W]) -> None:
        self.role, self.workers = role, list(workers)

    def __len__(self) -> int:
        return len(self.workers)

    def submit(self, method: Method[W, P, R], calls: Sequence[Args[P]], ranks: Sequence[int] | None = None,
               timeout_s: float | None = None, bulk: bool = False) -> Pending[R]:
        args, targets = plan_calls(calls, ranks, len(self.workers))
        name = method_name(method, self.workers[targets[0]]) if targets else getattr(method, "__name__", "")
        out = [self._run(name, r, a) for r, a in zip(targets, args)]
        return Pending(out, targets, name, self.role, ["local"] * len(self.workers), 0.0, LOCAL_WAITER, bulk)

    def _run(self, name: str, rank: int, call: Args[Any]) -> Any:
        """Call ``name`` on worker ``rank``: its result, or the `LocalFailure` of it (or of an input) raising."""
        # As Ray does for actor calls: a top-level ObjectRef argument arrives as its value
        # (workers may put into the object store whenever Ray is up, local mode or not).
        a = tuple(ray.get(x) if isinstance(x, ray.ObjectRef) else x for x in call.args)
        upstream = failed_input(a)
        if upstream is not None:
            return LocalFailure(upstream)
        try:
            return getattr(self.workers[rank], name)(*a, **call.kwargs)
        except Exception as err:
            failure = WorkerError(self.role, rank, "local", f"{name} raised: {type(err).__name__}: {err}")
            failure.__cause__ = err
            return LocalFailure(failure)

    def each(self, method: Method[W, P, R], *args: P.args, **kwargs: P.kwargs) -> Pending[R]:
        """The same call of ``method`` on every worker, in rank order."""
        return self.submit(method, [Args(*args, **kwargs)] * len(self.workers))

    def submit_parts(self, method: Method[W, P, Any], calls: Sequence[Args[P]], parts: int,
                     bulk: bool = False) -> list[Pending[Any]]:
        whole = self.submit(method, calls, bulk=bulk)
        return [replace(whole, handles=[h if isinstance(h, LocalFailure) else h[j] for h in whole.handles])
                for j in range(parts)]

    def call(self, method: Method[W, P, R], calls: Sequence[Args[P]], ranks: Sequence[int] | None = None,
             timeout_s: float | None = None) -> list[R]:
        return self.submit(method, calls, ranks).result()

    def hold(self, kept: Kept[T]) -> Pending[T]:
        """Results kept by value (`Pending.keep`): in-process handles are the values themselves."""
        return Pending(list(kept.values), kept.ranks, kept.method, self.role, ["local"] * len(self.workers), 0.0,
                       LOCAL_WAITER, kept.bulk)

    def keep_refs(self) -> None:
        return None  # in-process workers are never restarted

    def restarts(self) -> int:
        return 0  # in-process workers are never restarted

    def replace_all(self) -> bool:
        return False

    def shutdown(self) -> None:
        return None
