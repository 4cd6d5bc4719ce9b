"""Connecting the driver to Ray: a cluster at ``ray.address`` / RAY_ADDRESS, reached within ``ray.connect_timeout_s``
or refused with what to do, or a new local instance (`toolbox.driver.local_ray`). Not covered: starting a cluster."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from toolbox.config.schema import ExperimentConfig
from toolbox.core.errors import ConfigError
from toolbox.core.retry import RetryPolicy
from toolbox.driver.local_ray import LOCAL_DEFAULTS, WORKER_ENV, ray_env, start_local


def live_nodes() -> int:
    """How many nodes of the connected Ray cluster are alive."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def ray_init_kwargs(cfg: ExperimentConfig) -> dict[str, Any]:
    """Connect to ``ray.address`` / RAY_ADDRESS (a cluster, or ray job submit) or start a new local instance.

    Without an address the instance is always a new one (``address="local"``): ``None`` would join whatever
    cluster /tmp/ray/ray_current_cluster names, someone else's, or a dead one that hangs start-up forever. Its
    workers inherit `WORKER_ENV` from the raylet (`connect_ray`) rather than from a job runtime env, which would
    keep Ray from handing the worker processes it starts ahead to our actors. A cluster's workers get both from the
    job's runtime env (`ray_env`: Ray's settings that act inside each actor's process).
    """
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS") or "local"
    if address != "local":
        return {"address": address, "runtime_env": {"env_vars": ray_env() | WORKER_ENV}}
    kwargs = dict(LOCAL_DEFAULTS)
    if cfg.ray.num_cpus:
        kwargs["num_cpus"] = cfg.ray.num_cpus
    return kwargs


# Ray's own knob for how many times (about one a second) a driver tries to reach the GCS before giving up.
GCS_ATTEMPTS_ENV = "RAY_gcs_server_port_wait_time_s"


def connect_ray(cfg: ExperimentConfig, **overrides: Any) -> None:
    """``ray.init`` as `ray_init_kwargs` says (``overrides`` on top), bounded by ``ray.connect_timeout_s``.

    A given address must accept a connection within the timeout, or `ConfigError` names it and what to do;
    then Ray makes one attempt to reach its GCS (it would otherwise retry for many minutes).
    """
    import ray

    kwargs = {**ray_init_kwargs(cfg), **overrides}
    address = str(kwargs["address"])
    if address == "local":
        start_local(kwargs)
        return
    field = f"ray.address={address}" if cfg.ray.address else f"RAY_ADDRESS={address}"
    timeout = cfg.ray.connect_timeout_s
    advice = ("start the cluster (`ray start --head`) or fix the address; leave ray.address and RAY_ADDRESS unset to "
              "start a local instance")
    problem = unreachable(address, timeout)
    if problem:
        raise ConfigError(f"{field}: no Ray cluster answers within {timeout:g}s (ray.connect_timeout_s): {problem}; "
                          f"{advice}")
    previous = os.environ.get(GCS_ATTEMPTS_ENV)
    os.environ.setdefault(GCS_ATTEMPTS_ENV, "1")
    try:
        ray.init(**kwargs)
    except ConnectionError as err:
        raise ConfigError(f"{field}: something listens there but Ray could not connect ({err}); {advice}") from None
    finally:
        if previous is None:
            os.environ.pop(GCS_ATTEMPTS_ENV, None)


def unreachable(address: str, timeout_s: float) -> str:
    """Why nothing accepts a TCP connection at ``address`` (``host:port``, ``ray://host:port`` or ``auto``) within
    ``timeout_s``, trying again every half second at most under the one retry policy (a head may be starting);
    empty when something does."""
    host, port, problem = _host_port(address)
    if problem:
        return problem
    deadline = time.monotonic() + timeout_s

    def connect() -> None:
        socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))).close()

    waiting = RetryPolicy(attempts=10**6, first_pause_s=0.5, max_pause_s=0.5, deadline_s=timeout_s)  # a deadline
    try:
        waiting.call(connect, what=f"ray head {host}:{port}", retryable=lambda err: isinstance(err, OSError),
                     level=logging.DEBUG)  # a head still starting is expected; the caller says why it gave up
    except OSError as err:
        return f"{host}:{port}: {err.strerror or err}"
    return ""


def _host_port(address: str) -> tuple[str, int, str]:
    """``(host, port, "")``, or ``("", 0, why)`` when ``address`` names no host."""
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            found = canonicalize_bootstrap_address(address)
        except ConnectionError as err:
            return "", 0, str(err)
        if not found:
            return "", 0, "address=auto found no running cluster on this machine"
        address = found
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port or (10001 if parts.scheme == "ray" else 6379)
    except ValueError as err:
        return "", 0, f"not a host:port address ({err})"
    if not parts.hostname:
        return "", 0, "not a host:port address"
    return parts.hostname, port, ""
