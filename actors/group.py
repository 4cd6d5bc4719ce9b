"""Worker groups: N actors of one role in a placement group, with every call bounded by a timeout.

`WorkerGroup` (Ray) and `LocalGroup` (in-process, for tests and ``ray.local_mode``)
share one interface, which the typed role facades in `toolbox.actors.roles` build on
(trainers never call a group by method name):

- ``submit(method, args_list, ranks)`` starts one call per entry of ``args_list``
  (rank ``ranks[i]``, default ``i`` modulo the group size) and returns a `Pending`;
- `toolbox.core.pending.wait` waits for pendings of several groups at once, and
  ``Pending.result()`` fetches one's results;
- ``call`` is submit + result.

An argument may be another call's pending handle (an object ref): Ray starts the call
when that result is ready, so calls chain without the driver waiting in between.
Workers return their bulk results themselves (Ray stores them; the driver holds refs).
A call that overruns its role's timeout, or an actor that dies or raises, becomes a
`WorkerError` naming the role, the rank and the node: the run fails loudly instead of
hanging.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from toolbox.core.errors import WorkerError
from toolbox.core.pending import Pending, T, deadlines

Args = tuple[Any, ...]


def _plan(args_list: Sequence[Args] | None, ranks: Sequence[int] | None, size: int) -> tuple[list[Args], list[int]]:
    args = list(args_list) if args_list is not None else [() for _ in range(size)]
    targets = [r % size for r in ranks] if ranks is not None else [i % size for i in range(len(args))]
    return args, targets


class RayWaiter:
    """Waits for object refs of calls on any number of groups, with one deadline."""

    def wait(self, pendings: Sequence[Pending[Any]]) -> None:
        limits = dict(zip(map(id, pendings), deadlines(pendings)))
        calls = [(p, i) for p in pendings for i in range(len(p))]
        refs = [p.handles[i] for p, i in calls]
        remaining = list(refs)
        while remaining:
            nearest = min(limits[id(calls[refs.index(r)][0])] for r in remaining)
            ready, remaining = ray.wait(remaining, num_returns=1, timeout=max(0.0, nearest - time.monotonic()),
                                        fetch_local=False)
            if not ready:
                if all(limits[id(calls[refs.index(r)][0])] > time.monotonic() for r in remaining):
                    continue
                # The first call (in pipeline order) still running held the others up.
                p, i = calls[refs.index(remaining[0])]
                raise WorkerError(p.role, p.ranks[i], p.node(i), f"{p.method} did not finish within {p.timeout_s}s "
                                  f"({len(remaining)} of {len(refs)} calls still running)")
            p, i = calls[refs.index(ready[0])]
            if not p.bulk:
                err = _failure(p, i)
                if err is not None:
                    raise _root_cause(pendings) or err

    def fetch(self, pending: Pending[T]) -> list[T]:
        return ray.get(pending.handles)


def _failure(pending: Pending[Any], i: int) -> WorkerError | None:
    """The `WorkerError` of call ``i`` if it failed (fetching its result: only for small or failed ones)."""
    try:
        ray.get(pending.handles[i])
    except (RayActorError, RayTaskError) as err:
        what = "died" if isinstance(err, RayActorError) else "raised"
        cause = err.cause if isinstance(err, RayTaskError) and err.cause is not None else err
        failure = WorkerError(pending.role, pending.ranks[i], pending.node(i),
                              f"{pending.method} {what}: {type(cause).__name__}: {cause}")
        failure.__cause__ = err
        return failure
    return None


def _root_cause(pendings: Sequence[Pending[Any]]) -> WorkerError | None:
    """The first finished call, in pipeline order, that failed: a dead rollout worker, not the learner it starved."""
    for p in pendings:
        for i, ref in enumerate(p.handles):
            done, _ = ray.wait([ref], timeout=0, fetch_local=False)
            failure = _failure(p, i) if done else None
            if failure is not None:
                return failure
    return None


class LocalWaiter:
    """Handles of in-process calls are their results already."""

    def wait(self, pendings: Sequence[Pending[Any]]) -> None:
        return None

    def fetch(self, pending: Pending[T]) -> list[T]:
        return list(pending.handles)


RAY_WAITER, LOCAL_WAITER = RayWaiter(), LocalWaiter()


class WorkerGroup:
    """``num_workers`` Ray actors of ``cls`` for one ``role``, placed in one placement group."""

    def __init__(self, role: str, cls: type, num_workers: int, make_kwargs: Callable[[int], dict[str, Any]],
                 timeout_s: float, cpus: float = 1.0, gpus: float = 0.0, env: dict[str, str] | None = None,
                 placement_timeout_s: float = 60.0, placement: tuple[PlacementGroup, int] | None = None) -> None:
        """``placement=(pg, first)`` puts the actors in bundles ``first..first+n-1`` of an existing placement
        group (a Tune trial's); otherwise the group reserves a placement group of its own."""
        self.role, self.timeout_s = role, timeout_s
        self.nodes: list[str | None] = [None] * num_workers
        self.owns_pg = placement is None
        if placement is None:
            self.pg, first = self._reserve(num_workers, cpus, gpus, placement_timeout_s), 0
        else:
            self.pg, first = placement
        remote_cls = ray.remote(cls)
        self.actors = [
            remote_cls.options(
                num_cpus=cpus, num_gpus=gpus, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, first + i),
                runtime_env={"env_vars": env or {}},
            ).remote(**make_kwargs(i))
            for i in range(num_workers)
        ]
        # Start-up (model loading) is bounded by the longer of the two budgets.
        infos = self.call("ready", timeout_s=max(timeout_s, placement_timeout_s))
        self.nodes = [info.get("node_ip") for info in infos]

    def _reserve(self, n: int, cpus: float, gpus: float, timeout_s: float) -> PlacementGroup:
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        pg = placement_group([bundle] * n, strategy="PACK")
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except GetTimeoutError:
            remove_placement_group(pg)
            raise WorkerError(self.role, -1, None, f"placement group of {n} x {bundle} was not scheduled within "
                              f"{timeout_s}s; free: {ray.available_resources().get('CPU', 0):.2f} of "
                              f"{ray.cluster_resources().get('CPU', 0):.2f} CPUs (lower {self.role}.cpus_per_worker "
                              "or add nodes)") from None
        return pg

    def __len__(self) -> int:
        return len(self.actors)

    def submit(self, method: str, args_list: Sequence[Args] | None = None, ranks: Sequence[int] | None = None,
               timeout_s: float | None = None, bulk: bool = False) -> Pending[Any]:
        args, targets = _plan(args_list, ranks, len(self.actors))
        refs = [getattr(self.actors[r], method).remote(*a) for r, a in zip(targets, args)]
        return Pending(refs, targets, method, self.role, self.nodes, timeout_s or self.timeout_s, RAY_WAITER, bulk)

    def call(self, method: str, args_list: Sequence[Args] | None = None, ranks: Sequence[int] | None = None,
             timeout_s: float | None = None) -> list[Any]:
        return self.submit(method, args_list, ranks, timeout_s).result()

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.owns_pg:
            remove_placement_group(self.pg)


class LocalGroup:
    """In-process stand-in for `WorkerGroup`: same methods; calls run eagerly in ``submit``."""

    def __init__(self, role: str, workers: list[Any]) -> None:
        self.role, self.workers = role, workers

    def __len__(self) -> int:
        return len(self.workers)

    def submit(self, method: str, args_list: Sequence[Args] | None = None, ranks: Sequence[int] | None = None,
               timeout_s: float | None = None, bulk: bool = False) -> Pending[Any]:
        args, targets = _plan(args_list, ranks, len(self.workers))
        out = []
        for r, a in zip(targets, args):
            # As Ray does for actor calls: a top-level ObjectRef argument arrives as its value
            # (workers may put into the object store whenever Ray is up, local mode or not).
            a = tuple(ray.get(x) if isinstance(x, ray.ObjectRef) else x for x in a)
            try:
                out.append(getattr(self.workers[r], method)(*a))
            except Exception as err:
                raise WorkerError(self.role, r, "local", f"{method} raised: {type(err).__name__}: {err}") from err
        return Pending(out, targets, method, self.role, ["local"] * len(self.workers), 0.0, LOCAL_WAITER, bulk)

    def call(self, method: str, args_list: Sequence[Args] | None = None, ranks: Sequence[int] | None = None,
             timeout_s: float | None = None) -> list[Any]:
        return self.submit(method, args_list, ranks).result()

    def shutdown(self) -> None:
        return None
