"""Moving bulk data between actors as object refs, and fetching it inside an actor."""

from __future__ import annotations

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
    return {"node_id": ray.get_runtime_context().get_node_id()[:12], "node_ip": ray.util.get_node_ip_address()}
