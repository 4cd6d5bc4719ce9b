"""Worker groups: N actors of one role in a placement group, with every call bounded by a timeout.

`WorkerGroup` (Ray) and `LocalGroup` (in-process, for tests and ``ray.local_mode``)
share one interface, so trainers never touch ``ray`` and tests can hand them fakes:

- ``submit(method, args_list, ranks)`` starts one call per entry of ``args_list``
  (rank ``ranks[i]``, default ``i`` modulo the group size) and returns pending handles;
- ``get(pending)`` waits for them and returns the results;
- ``call`` is both.

Workers return small values only: metrics, and object refs to bulk data they put in
the object store themselves (see `toolbox.actors.resolve.share`), so the driver
never holds a batch. A call that overruns the role's timeout, or an actor that dies
or raises, becomes a `WorkerError` naming the role, the rank and the node: the run
fails loudly instead of hanging.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from toolbox.core.errors import WorkerError

Args = tuple[Any, ...]


@dataclass
class Pending:
    """Calls in flight: their refs (or values, locally), the ranks they went to, the method name."""

    handles: list[Any]
    ranks: list[int]
    method: str


def _plan(args_list: Sequence[Args] | None, ranks: Sequence[int] | None, size: int) -> tuple[list[Args], list[int]]:
    args = list(args_list) if args_list is not None else [() for _ in range(size)]
    targets = [r % size for r in ranks] if ranks is not None else [i % size for i in range(len(args))]
    return args, targets


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

    def submit(self, method: str, args_list: Sequence[Args] | None = None, ranks: Sequence[int] | None = None) -> Pending:
        args, targets = _plan(args_list, ranks, len(self.actors))
        refs = [getattr(self.actors[r], method).remote(*a) for r, a in zip(targets, args)]
        return Pending(refs, targets, method)

    def get(self, pending: Pending, timeout_s: float | None = None) -> list[Any]:
        budget = timeout_s or self.timeout_s
        deadline = time.monotonic() + budget
        remaining = list(pending.handles)
        while remaining:
            ready, remaining = ray.wait(remaining, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                rank = pending.ranks[pending.handles.index(remaining[0])]
                raise WorkerError(self.role, rank, self.nodes[rank], f"{pending.method} did not finish within {budget}s "
                                  f"({len(remaining)} of {len(pending.handles)} calls still running)")
            self._check(pending, ready[0])
        return ray.get(pending.handles)

    def _check(self, pending: Pending, ref: Any) -> None:
        try:
            ray.get(ref)
        except (RayActorError, RayTaskError) as err:
            rank = pending.ranks[pending.handles.index(ref)]
            what = "died" if isinstance(err, RayActorError) else "raised"
            cause = err.cause if isinstance(err, RayTaskError) and err.cause is not None else err
            raise WorkerError(self.role, rank, self.nodes[rank],
                              f"{pending.method} {what}: {type(cause).__name__}: {cause}") from err

    def call(self, method: str, args_list: Sequence[Args] | None = None, ranks: Sequence[int] | None = None,
             timeout_s: float | None = None) -> list[Any]:
        return self.get(self.submit(method, args_list, ranks), timeout_s)

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

    def submit(self, method: str, args_list: Sequence[Args] | None = None, ranks: Sequence[int] | None = None) -> Pending:
        args, targets = _plan(args_list, ranks, len(self.workers))
        out = []
        for r, a in zip(targets, args):
            # As Ray does for actor calls: a top-level ObjectRef argument arrives as its value
            # (workers share() into the object store whenever Ray is up, local mode or not).
            a = tuple(ray.get(x) if isinstance(x, ray.ObjectRef) else x for x in a)
            try:
                out.append(getattr(self.workers[r], method)(*a))
            except Exception as err:
                raise WorkerError(self.role, r, "local", f"{method} raised: {type(err).__name__}: {err}") from err
        return Pending(out, targets, method)

    def get(self, pending: Pending, timeout_s: float | None = None) -> list[Any]:
        return list(pending.handles)

    def call(self, method: str, args_list: Sequence[Args] | None = None, ranks: Sequence[int] | None = None,
             timeout_s: float | None = None) -> list[Any]:
        return self.get(self.submit(method, args_list, ranks))

    def shutdown(self) -> None:
        return None
