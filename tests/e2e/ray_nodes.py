"""Ray nodes started by a test on this machine: ``ray start --block`` processes that the test stops itself.

Each node runs under its own ``ray start --block`` (own temp dir and ports); SIGTERM to that process takes the
node's Ray processes down with it. Never ``ray stop``, which stops every Ray instance on the machine (another
test's, another suite's).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


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
    """``ray start ARGS --block`` until the cluster at ``env["RAY_ADDRESS"]`` has ``nodes`` nodes. On a loaded
    machine a raylet may miss Ray's fixed 30 s registration window and its ``ray start`` exits: then it is started
    again. (``RAY_ADDRESS`` is for the probe only: the node's processes, a head's job agent among them, do not get it.)"""
    node_env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
    for _ in range(3):
        proc = subprocess.Popen([str(BIN / "ray"), "start", "--block", *args], env=node_env, stdout=subprocess.DEVNULL,
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


def stop_nodes(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every ``ray start --block`` in ``procs`` (newest first), then wait for each (killed after 60 s)."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in reversed(procs):
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
