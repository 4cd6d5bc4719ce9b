"""How the driver calls a group's workers and waits for them: `Args` (one call's arguments, checked against the
worker method they are for), `method_name` (the name Ray calls it by), and the `Waiter`s of Ray refs and of
in-process results. `toolbox.actors.group` builds its groups on these."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import ray
from ray.exceptions import RayActorError, RayTaskError

from toolbox.core.errors import WorkerError
from toolbox.core.pending import Pending, T, deadlines

P = ParamSpec("P")
R = TypeVar("R")
W = TypeVar("W", covariant=True)  # the workers' class: a group of RolloutWorkers runs any method a RolloutWorker has


class Args(Generic[P]):
    """The arguments of one call of a worker method: ``Args(shard, sampling)``. Given to a group with the method
    (``group.submit(RolloutWorker.generate, [Args(shard, sampling)])``), they are checked against its signature."""

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        self.args, self.kwargs = args, kwargs

    def __repr__(self) -> str:
        return f"Args(*{self.args!r}, **{self.kwargs!r})"


Method = Callable[Concatenate[W, P], R]  # an unbound method of the workers' class: ``RolloutWorker.generate``


def method_name(method: Callable[..., Any], worker: Any) -> str:
    """The name a worker ``method`` is called by; a method ``worker`` (a class or an instance) lacks is a
    `TypeError` naming both, raised at the call site rather than inside an actor."""
    name = getattr(method, "__name__", None)
    if not isinstance(name, str) or not callable(getattr(worker, name, None)):
        owner = worker if isinstance(worker, type) else type(worker)
        raise TypeError(f"{getattr(method, '__qualname__', method)!r} is not a method of {owner.__name__}: a group "
                        "calls its workers' own methods (group.submit(RolloutWorker.generate, ...))")
    return name


def plan_calls(calls: Sequence[Args[Any]], ranks: Sequence[int] | None, size: int) -> tuple[list[Args[Any]], list[int]]:
    targets = [r % size for r in ranks] if ranks is not None else [i % size for i in range(len(calls))]
    return list(calls), targets


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


class LocalFailure:
    """The handle of an in-process call that raised: its error, raised by the wait that looks at it (and handed to
    the calls given it), as Ray holds a failed actor call's error in its ref until a wait or a dependent call."""

    def __init__(self, error: WorkerError) -> None:
        self.error = error


def failed_input(args: tuple[Any, ...]) -> WorkerError | None:
    """The error of the first failed call among ``args`` (a handle, or a list of handles)."""
    for arg in args:
        for handle in arg if isinstance(arg, (list, tuple)) else (arg,):
            if isinstance(handle, LocalFailure):
                return handle.error
    return None


class LocalWaiter:
    """Handles of in-process calls are their results already (or the `LocalFailure` of a call that raised)."""

    def wait(self, pendings: Sequence[Pending[Any]]) -> None:
        for pending in pendings:
            failed = failed_input(pending.handles)
            if failed is not None:
                raise failed

    def fetch(self, pending: Pending[T]) -> list[T]:
        self.wait([pending])
        return list(pending.handles)


RAY_WAITER, LOCAL_WAITER = RayWaiter(), LocalWaiter()
