"""The start-up breakdown (`toolbox.driver.startup`) and how a local Ray instance passes the worker env on (no Ray here)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from toolbox.config import load_config
from toolbox.core.events import Event, EventBus
from toolbox.driver.local_ray import RAY_ENV, WORKER_ENV, actor_env
from toolbox.driver.ray_connect import ray_init_kwargs
from toolbox.driver.startup import StartupClock, launch_time


def test_launch_time_is_this_process_start() -> None:
    # pytest has imported torch and more by now: the process started a while before this line
    assert launch_time() < time.time() - 0.2


def test_launch_time_is_when_the_parent_started_the_process() -> None:
    """To the clock tick (10 ms; 0.1 s allowed for a busy machine), not to the second as psutil's create_time."""
    import subprocess
    import sys

    before = time.time()
    out = subprocess.run([sys.executable, "-c", "from toolbox.driver.startup import launch_time; print(repr(launch_time()))"],
                         capture_output=True, text=True, check=True).stdout
    assert before - 0.1 < float(out) < before + 0.1 + (time.time() - before) / 2


def test_phases_add_up_to_the_total_and_repeat_phases_accumulate() -> None:
    clock = StartupClock(launched=time.time() - 2.0)
    clock.mark("launch")
    clock.mark("actors")
    time.sleep(0.05)
    clock.mark("actors")  # a second learner group started: its time adds to the phase
    metrics = clock.metrics()
    assert list(metrics) == ["startup/launch_s", "startup/actors_s", "startup/total_s"]
    assert metrics["startup/launch_s"] == pytest.approx(2.0, abs=0.1)
    assert metrics["startup/actors_s"] >= 0.05
    assert metrics["startup/total_s"] == pytest.approx(metrics["startup/launch_s"] + metrics["startup/actors_s"],
                                                       abs=0.01)
    assert clock.summary().startswith(f"{clock.total():.1f}s to the end of step 1 (launch 2.0, actors")


def test_the_first_step_carries_the_phases_and_writes_startup_json(tmp_path: Path) -> None:
    clock, bus, seen = StartupClock(), EventBus(), []
    clock.attach(bus, tmp_path)
    bus.subscribe(Event.STEP_END, lambda e, p: seen.append(dict(p["metrics"])))  # a callback, attached after
    bus.emit(Event.FIT_START, {"start_step": 0, "total_steps": 3})
    for step in (1, 2):
        bus.emit(Event.STEP_END, {"step": step, "metrics": {"loss": 1.0}})
    first, second = seen
    assert {"startup/first_sync_s", "startup/first_step_s", "startup/total_s"} <= set(first)
    assert all(k.endswith("_s") for k in first if k != "loss")  # timing readings, which no rerun reproduces
    assert first["startup/cpu_s"] > 0.5  # this pytest process alone has spent more than that importing torch
    assert second == {"loss": 1.0}  # later steps carry nothing
    assert json.loads((tmp_path / "startup.json").read_text()) == {k: v for k, v in first.items() if k != "loss"}
    assert clock.done and "first_step" in clock.summary()


def test_a_local_instance_passes_the_worker_env_by_inheritance_a_cluster_by_runtime_env(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    local = ray_init_kwargs(load_config([]))
    assert local["address"] == "local" and "runtime_env" not in local  # workers Ray starts ahead stay usable
    cluster = ray_init_kwargs(load_config(["ray.address=10.0.0.1:6379"]))
    assert cluster["runtime_env"] == {"env_vars": RAY_ENV | WORKER_ENV}
    setting = next(iter(RAY_ENV))
    monkeypatch.setenv(setting, "12")  # the driver's own value wins
    cluster = ray_init_kwargs(load_config(["ray.address=10.0.0.1:6379"]))
    assert cluster["runtime_env"]["env_vars"][setting] == "12"


def test_actors_get_the_whole_worker_env_unless_this_process_started_their_instance() -> None:
    import ray

    if ray.is_initialized():  # an integration test's session instance: not one `start_local` made
        pytest.skip("a Ray instance of another test is up")
    assert actor_env() == WORKER_ENV
