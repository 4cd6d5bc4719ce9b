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


# Waits, in a process of its own (so the test's process never talks to the cluster, whose token auth it may not
# share), until the GCS at argv[1] lists argv[2] alive nodes: the GCS's port polled first (Ray's client would wait
# out its own connect timeout on a port nobody listens on), then its node table every 0.1 s. One such process per
# node start, about 0.4 CPU s, where a driver joining the cluster every 2 s cost ~1.5 s each.
NODE_WAIT = """
import socket, sys, time
address, want, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
host, port = address.rsplit(":", 1)
while True:
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.1)
from ray._raylet import GcsClient
gcs = None
while time.monotonic() < deadline:
    try:  # a GCS still starting may refuse the client or the call: asked again
        gcs = gcs or GcsClient(address=address)
        if sum(node.state == 0 for node in gcs.get_all_node_info(timeout=10).values()) >= want:  # 0: ALIVE
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit(1)
"""


def start_node(args: list[str], env: dict[str, str], nodes: int, procs: list[subprocess.Popen[bytes]]) -> None:
    """``ray start ARGS --block`` until the cluster at ``env["RAY_ADDRESS"]`` has ``nodes`` alive nodes. On a loaded
    machine a raylet may miss Ray's fixed 30 s registration window and its ``ray start`` exits: then it is started
    again. (``RAY_ADDRESS`` is for the wait only: the node's processes, a head's job agent among them, do not get it.)"""
    node_env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
    for _ in range(3):
        proc = subprocess.Popen([str(BIN / "ray"), "start", "--block", *args], env=node_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        procs.append(proc)
        wait = subprocess.Popen([sys.executable, "-c", NODE_WAIT, env["RAY_ADDRESS"], str(nodes), "300"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while wait.poll() is None and proc.poll() is None:
            time.sleep(0.1)
        if wait.poll() is None:  # the node's `ray start` exited first
            wait.kill()
            wait.wait()
        elif wait.returncode == 0:
            return
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
