"""End to end on a two-node Ray cluster on this machine: a run and a sweep whose actors use both nodes.

The cluster is two ``ray start --block`` processes (a head, and a second node offering the custom
resource ``node_b``) with their own temp dir and ports and token auth; the drivers connect with
``RAY_ADDRESS``, as the entrypoint of ``ray job submit`` does. Teardown stops exactly these two
processes (``--block`` makes each take its node's Ray processes down with it), never ``ray stop``,
which would stop every Ray instance on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
BIN = Path(sys.executable).parent
# The rollout workers need node_b (only the second node has it), the learner ranks node_a (only the head).
SPLIT = ["experiment=grpo_tiny", "rollout.num_workers=2", "reward.num_workers=1", "learner.num_workers=2",
         "ray.placement.rollout.resources.node_b=1", "ray.placement.learner.resources.node_a=1", "algorithm.prompts_per_step=4", "learner.micro_batch_size=8",
         "trainer.total_steps=2", "trainer.eval_every=0", "callbacks=[{name: jsonl}]"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive_nodes(env: dict[str, str]) -> int:
    """Alive nodes, asked from a short-lived driver (so this process never joins the cluster); 0 if none answers."""
    probe = "import ray; ray.init(); print(sum(node['Alive'] for node in ray.nodes()))"
    try:
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return 0
    last = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
    return int(last[0]) if last and last[0].isdigit() else 0


def start_node(args: list[str], env: dict[str, str], nodes: int, procs: list[subprocess.Popen[bytes]]) -> None:
    """``ray start ARGS --block`` until the cluster has ``nodes`` nodes. On a loaded machine a raylet may miss
    Ray's fixed 30 s registration window and its ``ray start`` exits: then it is started again."""
    for _ in range(3):
        proc = subprocess.Popen([str(BIN / "ray"), "start", *args], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        procs.append(proc)
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if alive_nodes(env) >= nodes:
                return
            time.sleep(2.0)
        if proc.poll() is None:
            break
    raise TimeoutError(f"ray start {' '.join(args)}: the cluster did not reach {nodes} nodes")


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[dict[str, str]]:
    """The environment of a driver of a two-node cluster (RAY_ADDRESS, token auth)."""
    temp = tempfile.mkdtemp(prefix="raymn", dir="/tmp")  # short: Ray's unix socket paths stay under 107 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "token"
    port, ip = free_port(), ray.util.get_node_ip_address()  # the GCS listens on this node's IP, not on 127.0.0.1
    env["RAY_ADDRESS"] = f"{ip}:{port}"
    common = ["--block", "--num-cpus=2", f"--temp-dir={temp}", "--disable-usage-stats"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        start_node(["--head", f"--port={port}", "--include-dashboard=false", '--resources={"node_a": 2}', *common],
                   env, 1, procs)
        start_node([f"--address={ip}:{port}", '--resources={"node_b": 2}', *common], env, 2, procs)
        yield env
    finally:
        for proc in reversed(procs):  # only the processes this fixture started, by their ids
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(temp, ignore_errors=True)


def run(args: list[str], env: dict[str, str], module: str = "toolbox.run") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=600)


def test_a_local_run_root_on_two_nodes_fails_at_start_naming_the_flag(two_nodes: dict[str, str], tmp_path: Path) -> None:
    out = run([*SPLIT, f"trainer.run_root={tmp_path}"], two_nodes)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "the Ray cluster has 2 nodes" in out.stderr and "trainer.shared_fs=true" in out.stderr


def test_a_run_and_a_sweep_place_actors_on_both_nodes(two_nodes: dict[str, str], tmp_path: Path) -> None:
    """Rollout workers on the node_b node, learner ranks on the node_a node: both nodes do work, in a run and
    in a sweep's trial (whose one placement group then spans the two nodes). This machine's disk is the shared
    filesystem of both nodes, hence trainer.shared_fs=true."""
    out = run([*SPLIT, f"trainer.run_root={tmp_path / 'runs'}", "trainer.shared_fs=true"], two_nodes)
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").glob("grpo_tiny-*")
    nodes = json.loads((run_dir / "nodes.json").read_text())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if s["event"] == "step_end"] == [1, 2]
    assert len(set(nodes["rollout"])) == len(set(nodes["learner"])) == 1 and None not in nodes["rollout"], nodes
    assert set(nodes["rollout"]) != set(nodes["learner"]), f"rollout and learner on one node: {nodes}"

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"experiment: grpo_tiny\noverrides: {json.dumps(SPLIT[1:])}\n"
                     "param_space:\n  algorithm.kl_coef: {grid: [0.0]}\n")
    out = run([f"sweep={sweep}", f"trainer.run_root={tmp_path / 'sweep'}", "trainer.shared_fs=true"], two_nodes,
              module="toolbox.tune")
    assert out.returncode == 0, out.stderr[-3000:]
    (trial_dir,) = (tmp_path / "sweep").glob("sweeps/*/runs/run_trial_*")
    trial_nodes = json.loads((trial_dir / "nodes.json").read_text())
    assert set(trial_nodes["rollout"]) == set(nodes["rollout"]), (trial_nodes, nodes)
    assert set(trial_nodes["learner"]) == set(nodes["learner"]), (trial_nodes, nodes)
