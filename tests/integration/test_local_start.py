"""A local instance started by `connect_ray` (real Ray, in a fresh process: the session's instance is not one):
its workers inherit the worker env, the driver's own env is left as it was, actors run in the worker
processes Ray started ahead instead of each waiting for a new one, and Ray's autoscaler monitor (nothing to
scale) is gone once the instance is up."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import psutil, ray
    from toolbox.actors.group import WorkerGroup
    from toolbox.config import load_config
    from toolbox.driver.local_ray import MONITOR_SCRIPT, RAY_ENV, WORKER_ENV, actor_env
    from toolbox.driver.ray_connect import connect_ray

    class Probe:
        def ready(self):
            return {}
        def report(self):
            return os.getpid(), {k: os.environ.get(k) for k in (*WORKER_ENV, *RAY_ENV)}

    os.environ["TOKENIZERS_PARALLELISM"] = "true"  # the driver's own choice, which start-up must leave alone
    connect_ray(load_config(["ray.num_cpus=2"]))
    monitors = [p.pid for p in psutil.Process().children() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                and any(a.endswith(MONITOR_SCRIPT) for a in p.cmdline())]
    started = sorted(ray._private.worker._global_node.all_processes)  # the kinds of process Ray's start launched
    dashboard_packages = [name for name in ("aiohttp", "opencensus", "prometheus_client") if name in sys.modules]
    idle, deadline = set(), time.monotonic() + 60
    while not idle and time.monotonic() < deadline:  # the workers Ray starts ahead, once they are up
        idle = {p.pid for p in psutil.Process().children(recursive=True) if p.name() == "ray::IDLE"}
        time.sleep(0.2)
    group = WorkerGroup("rollout", Probe, 2, lambda r: {}, timeout_s=120, cpus=0.01, env=actor_env())
    reports = group.each(Probe.report).result()
    print(json.dumps({"driver": os.environ["TOKENIZERS_PARALLELISM"], "driver_ray": [os.environ.get(k) for k in RAY_ENV], "idle": sorted(idle), "env": actor_env(),
                      "workers": reports, "monitors": monitors, "started": started,
                      "dashboard_packages": dashboard_packages}))
    ray.shutdown()
""")


def test_a_local_instance_hands_its_started_workers_to_actors_with_the_worker_env() -> None:
    from toolbox.driver.local_ray import RAY_ENV, WORKER_ENV

    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["driver"] == "true" and out["driver_ray"] == [None] * len(RAY_ENV)  # restored after ray.init
    assert out["env"] == {}  # nothing to add per actor: no runtime env, so the started workers match
    assert out["idle"], "Ray started no worker ahead"
    assert out["monitors"] == [], "the autoscaler monitor outlived the start"
    assert "gcs_server" in out["started"] and "monitor" not in out["started"], out["started"]  # never started
    assert out["dashboard_packages"] == []  # looked up, not imported, by the driver
    for _, env in out["workers"]:
        assert env == WORKER_ENV | RAY_ENV  # inherited from the raylet
    reused = {pid for pid, _ in out["workers"]} & set(out["idle"])
    assert reused, f"no actor ran in a worker Ray had started ahead: actors {out['workers']}, idle {out['idle']}"


EARLY = textwrap.dedent("""
    import json, time
    import psutil, ray
    from toolbox.driver.local_ray import GCS_PROCESS, LOCAL_DEFAULTS, EarlyRay

    early = EarlyRay()  # in its thread, while this one carries on once the GCS is started
    gcs = [child.name() for child in psutil.Process().children()].count(GCS_PROCESS)
    used = early.take(dict(LOCAL_DEFAULTS))
    time.sleep(2)  # the head processes outlive the start: they die with the thread that started them
    answered = ray.get(ray.remote(lambda: 7).remote(), timeout=60)
    ray.shutdown()
    early.close()
    other = EarlyRay()
    print(json.dumps({"gcs": gcs, "used": used, "answered": answered,
                      "other": other.take({**LOCAL_DEFAULTS, "num_cpus": 1}), "after": ray.is_initialized()}))
    other.abandon()
""")


def test_an_early_instance_is_used_when_the_config_asks_for_it_and_dropped_otherwise() -> None:
    done = subprocess.run([sys.executable, "-c", EARLY], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"gcs": 1, "used": True, "answered": 7,
                                                                "other": False, "after": False}
    assert "not the main thread" not in done.stderr  # Ray's warning about its signal handler is dropped


def test_the_start_up_floor_is_measured_as_a_run_is(tmp_path: Path) -> None:
    """`toolbox bench startup --floor`'s side: Ray started as a run starts it and two actors importing torch, timed
    and CPU-counted by the reader of a run's first step, in a process that exits 0."""
    from toolbox.bench.startup import FLOOR, one_run

    floor = one_run(FLOOR, 1, [], tmp_path, "floor")
    assert 0 < floor["to_step_1_s"] < floor["to_exit_s"] and floor["tree_cpu_s"] > 1.0, floor


def test_the_attached_side_runs_on_a_head_already_up_and_counts_its_workers(tmp_path: Path) -> None:
    """`toolbox bench startup --attached`'s side: a run attached to the head the bench starts (``ray start``, token
    auth) reaches step 1; its CPU seconds count the workers the head's raylet started for it (each imports torch),
    besides the driver's own; the head is gone afterwards."""
    import psutil

    from toolbox.bench.startup import ATTACHED, one_run, ray_head

    with ray_head() as head:
        run = one_run("", 1, ["experiment=grpo_tiny"], tmp_path, "attached", head)
        assert psutil.pid_exists(head[1])
    assert run["tree"] == ATTACHED and 0 < run["to_step_1_s"] < run["to_exit_s"], run
    assert run["head_cpu_s"] > 2.0 and run["tree_cpu_s"] > run["head_cpu_s"] + run["startup/cpu_s"] - 0.5, run
    assert not psutil.pid_exists(head[1]) or psutil.Process(head[1]).status() == psutil.STATUS_ZOMBIE
