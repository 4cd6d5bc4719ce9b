"""End to end on a two-node Ray cluster on this machine: a sweep whose trial's actors use both nodes, and a run
that survives the removal of the node hosting one of its rollout workers.

The cluster is two ``ray start --block`` processes (a head, and a second node offering the custom
resource ``node_b``) with their own temp dir and ports and token auth; the drivers connect with
``RAY_ADDRESS``, as the entrypoint of ``ray job submit`` does. Teardown stops exactly these
processes (``--block`` makes each take its node's Ray processes down with it), never ``ray stop``,
which would stop every Ray instance on the machine. A test that removes the second node does it the same
way (SIGTERM to that node's ``ray start``); the next test that needs two nodes starts it again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import ray

from tests.e2e.ray_nodes import start_node, stop_nodes
from tests.run_files import steps, wait_for
from toolbox.core.ports import free_port
from toolbox.driver.local_ray import RAY_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
# Both nodes run with the settings of the toolbox image (RAY_ENV); a removed node drains for 2 s, not Ray's 30 s (no
# Serve proxy here to drain).
NODE_ENV = {**RAY_ENV, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2"}
# The rollout workers need node_b (only the second node has it), the learner ranks node_a (only the head).
SPLIT = ["experiment=grpo_tiny_fsdp2", "rollout.num_workers=2", "reward.num_workers=1", "learner.num_workers=2",
         "ray.placement.rollout.resources.node_b=1", "ray.placement.learner.resources.node_a=1", "algorithm.prompts_per_step=4", "learner.micro_batch_size=8",
         "trainer.total_steps=2", "trainer.eval_every=0", "callbacks=[{name: jsonl}]"]


@dataclass
class Cluster:
    """The two-node cluster of this module: the head, and a second node that a test may remove and the next
    test gets back (`two_nodes`)."""

    env: dict[str, str]  # a driver's environment: RAY_ADDRESS, token auth
    common: list[str]  # the `ray start` flags both nodes share
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)  # every `ray start --block`, for teardown
    second: subprocess.Popen[bytes] | None = None  # the second node's `ray start --block`, while it runs

    def start_second(self) -> None:
        start_node([f"--address={self.env['RAY_ADDRESS']}", '--resources={"node_b": 2}', *self.common], self.env, 2,
                   self.procs)
        self.second = self.procs[-1]

    def remove_second(self) -> None:
        """Take the second node away as ``ray stop`` run on it would (SIGTERM to its processes, here to the
        ``ray start --block`` that stops them all), and wait until it is gone: never a plain ``ray stop``, which
        would stop every Ray instance on the machine."""
        assert self.second is not None and self.second.poll() is None, "the second node is not running"
        self.second.send_signal(signal.SIGTERM)
        self.second.wait(timeout=60)
        self.second = None


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head (custom resource ``node_a``) and a second node (``node_b``) on this machine, with token auth."""
    temp = tempfile.mkdtemp(prefix="raymn", dir="/tmp")  # short: Ray's unix socket paths stay under 107 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "token"
    env.update(NODE_ENV)
    port, ip = free_port(), ray.util.get_node_ip_address()  # the GCS listens on this node's IP, not on 127.0.0.1
    env["RAY_ADDRESS"] = f"{ip}:{port}"
    nodes = Cluster(env, ["--num-cpus=2", f"--temp-dir={temp}", "--disable-usage-stats"])
    try:
        start_node(["--head", f"--port={port}", "--include-dashboard=false", '--resources={"node_a": 2}',
                    *nodes.common], env, 1, nodes.procs)
        nodes.start_second()
        yield nodes
    finally:
        stop_nodes(nodes.procs)  # only the processes this fixture started, by their ids
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def two_nodes(cluster: Cluster) -> dict[str, str]:
    """The environment of a driver of the two-node cluster (its second node started again if a test removed it)."""
    if cluster.second is None or cluster.second.poll() is not None:
        cluster.start_second()
    return cluster.env


def run(args: list[str], env: dict[str, str], module: str = "toolbox.run") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=600)


def test_a_local_run_root_on_two_nodes_fails_at_start_naming_the_flag(two_nodes: dict[str, str], tmp_path: Path) -> None:
    out = run([*SPLIT, f"trainer.run_root={tmp_path}"], two_nodes)
    assert out.returncode == 2, out.stderr[-3000:]
    said = " ".join(out.stderr.split())  # the console wraps long lines wherever the run root's path puts the breaks
    assert "the Ray cluster has 2 nodes" in said and "trainer.shared_fs=true" in said


def test_a_sweep_trial_places_actors_on_both_nodes(two_nodes: dict[str, str], tmp_path: Path) -> None:
    """The rollout worker on the node_b node, the learner on the node_a node: both nodes do work in a sweep's
    trial, whose one placement group then spans the two nodes (a plain run across both nodes is the node-removal
    test's). One actor per side (the rollout worker scoring its own samples): the placement is what is tested, and
    each actor more is a process importing torch on this machine's 2 cores. This machine's disk is the shared
    filesystem of both nodes, hence trainer.shared_fs=true."""
    one_each = ["rollout.num_workers=1", "reward.num_workers=0", "learner.num_workers=1", "learner.strategy=single"]
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"experiment: grpo_tiny_fsdp2\noverrides: {json.dumps([*SPLIT[1:], *one_each])}\n"
                     "param_space:\n  algorithm.kl_coef: {grid: [0.0]}\n")
    out = run([f"sweep={sweep}", f"trainer.run_root={tmp_path / 'sweep'}", "trainer.shared_fs=true"], two_nodes,
              module="toolbox.commands.tune")
    assert out.returncode == 0, out.stderr[-3000:]
    (trial_dir,) = (tmp_path / "sweep").glob("sweeps/*/runs/run_trial_*")
    nodes = json.loads((trial_dir / "nodes.json").read_text())
    assert sorted(steps(trial_dir)) == [1, 2]
    assert len(nodes["rollout"]) == len(nodes["learner"]) == 1 and None not in nodes["rollout"], nodes
    assert set(nodes["rollout"]) != set(nodes["learner"]), f"rollout and learner on one node: {nodes}"


# Two rollout workers spread over the two nodes (SPREAD: one per node), every other actor on the head (node_a), a
# fraction of a CPU each: after the second node is gone, the head alone holds all of them.
HEAL = ["experiment=grpo_tiny_fsdp2", "rollout.num_workers=2", "ray.placement.rollout.strategy=SPREAD",
        "reward.num_workers=1", "learner.num_workers=1", "learner.strategy=single",
        "ray.placement.reward.resources.node_a=1", "ray.placement.learner.resources.node_a=1",
        "algorithm.prompts_per_step=4", "trainer.total_steps=6", "trainer.eval_every=0", "trainer.save_every=0",
        "trainer.log_samples_every=0", "callbacks=[{name: jsonl}]", "trainer.shared_fs=true", "trainer.run_name=heal"]


def test_removing_the_node_of_a_rollout_worker_mid_run_is_survived(cluster: Cluster, two_nodes: dict[str, str],
                                                                   tmp_path: Path) -> None:
    """The second node, host of one rollout worker, is removed after step 1 (the driver paused meanwhile, so the
    six steps cannot all be over before the node is gone): Ray reschedules that worker's placement-group bundle on
    the head and restarts the worker there (``rollout.max_restarts``), its unfinished calls run again, and the run
    completes with the restart counted."""
    run_dir = tmp_path / "heal"
    with (tmp_path / "driver.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "toolbox.run", *HEAL, f"trainer.run_root={tmp_path}"],
                                env=two_nodes, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(run_dir, "step_end", 1, proc, timeout_s=300)
            nodes = json.loads((run_dir / "nodes.json").read_text())
            (head,) = set(nodes["learner"])
            assert len(set(nodes["rollout"])) == 2 and head in nodes["rollout"], f"not one rollout worker per node: {nodes}"
            removed_at = time.monotonic()
            proc.send_signal(signal.SIGSTOP)  # the driver waits while the node goes: steps remain to be done after it
            try:
                cluster.remove_second()
            finally:
                proc.send_signal(signal.SIGCONT)
            gone = time.monotonic()
            assert proc.wait(timeout=300) == 0, (tmp_path / "driver.log").read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    done = steps(run_dir)
    assert sorted(done) == [1, 2, 3, 4, 5, 6]
    assert done[1]["rollout_restarts"] == 0 and done[6]["rollout_restarts"] == 1, done
    first = min(s for s in done if done[s]["rollout_restarts"])
    print(f"figures: node removed after step 1 in {gone - removed_at:.1f}s (driver paused meanwhile); restart "
          f"counted from step {first}; run done {time.monotonic() - gone:.1f}s after the node was gone "
          f"(step seconds {[round(done[s]['step_time_s'], 1) for s in sorted(done)]})")
