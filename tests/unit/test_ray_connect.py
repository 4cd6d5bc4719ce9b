"""Start-up never hangs: no address starts a new local instance; a given address is reached within a timeout
or the run fails naming it. No Ray instance is started here (the failures happen before ``ray.init``)."""

from __future__ import annotations

import socket
import time

import pytest

from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.driver.ray_connect import connect_ray, ray_init_kwargs, unreachable


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_address_starts_a_new_local_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    kwargs = ray_init_kwargs(load_config(["ray.num_cpus=3"]))
    assert kwargs["address"] == "local" and kwargs["num_cpus"] == 3  # never None: that joins ray_current_cluster
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    kwargs = ray_init_kwargs(load_config(["ray.num_cpus=3"]))
    assert kwargs["address"] == "10.0.0.1:6379" and "num_cpus" not in kwargs


def test_a_dead_address_fails_within_the_timeout_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    inits: list[object] = []  # the suite's integration tests may have left a Ray instance up: watch ray.init
    monkeypatch.setattr(ray, "init", lambda *a, **k: inits.append((a, k)))
    port = closed_port()
    cfg = load_config([f"ray.address=127.0.0.1:{port}", "ray.connect_timeout_s=1"])
    start = time.monotonic()
    with pytest.raises(ConfigError, match=rf"ray.address=127.0.0.1:{port}: no Ray cluster answers within 1s "
                                          r"\(ray.connect_timeout_s\): 127.0.0.1:\d+: Connection refused; start the "
                                          r"cluster \(`ray start --head`\)"):
        connect_ray(cfg)
    assert time.monotonic() - start < 5 and not inits
    monkeypatch.setenv("RAY_ADDRESS", f"ray://127.0.0.1:{port}")
    with pytest.raises(ConfigError, match=rf"^RAY_ADDRESS=ray://127.0.0.1:{port}: no Ray cluster answers"):
        connect_ray(load_config(["ray.connect_timeout_s=0.5"]))


def test_unreachable_says_why() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert unreachable(f"127.0.0.1:{server.getsockname()[1]}", 1.0) == ""
    assert unreachable("ray://", 0.1) == "not a host:port address"
    assert unreachable("host:notaport", 0.1).startswith("not a host:port address")
