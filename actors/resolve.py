"""Moving bulk data between actors as object refs, and fetching it inside an actor."""

from __future__ import annotations

import re
from typing import Any

import ray


def share(value: Any) -> Any:
    """Put ``value`` in the object store and return its ref (inside Ray); the value itself otherwise."""
    return ray.put(value) if ray.is_initialized() else value


def resolve(value: Any) -> Any:
    """``ray.get`` every ObjectRef in ``value`` (a ref, or a list of refs / values)."""
    if isinstance(value, ray.ObjectRef):
        return ray.get(value)
    if isinstance(value, list):
        refs = [i for i, v in enumerate(value) if isinstance(v, ray.ObjectRef)]
        got = ray.get([value[i] for i in refs]) if refs else []
        out = list(value)
        for i, v in zip(refs, got):
            out[i] = v
        return out
    return value


def node_info() -> dict[str, str]:
    """Where this process runs, for error messages."""
    if not ray.is_initialized():
        return {"node_ip": "local"}
    info = {"node_id": ray.get_runtime_context().get_node_id()[:12], "node_ip": ray.util.get_node_ip_address()}
    return {**info, **placement_info()}


def placement_info() -> dict[str, str]:
    """The placement group (hex id) and bundle index this actor runs in, when it runs in one.

    Ray names the resources of bundle i of a placement group ``<resource>_group_<i>_<pg id>``; the worker's
    assigned resource ids carry those names (Ray has no public call for the bundle index)."""
    pg = ray.get_runtime_context().get_placement_group_id()
    if pg is None:
        return {}
    try:
        names = ray._private.worker.global_worker.core_worker.resource_ids()
    except AttributeError:  # a private Ray API: never let it break an actor's start-up report
        names = {}
    index = next((m.group(1) for m in map(re.compile(rf"_group_(\d+)_{pg}$").search, names) if m), "")
    return {"placement_group": pg, "bundle": index}
