"""End to end: the real CLI, and ``ray start --head`` + ``ray job submit`` with token authentication."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from tests.e2e.ray_nodes import BIN, start_node, stop_nodes
from toolbox.core.ports import free_port

pytestmark = pytest.mark.e2e


def test_cli_rejects_bad_config_before_the_run_starts(tmp_path: Path) -> None:
    """No run directory, exit 2, the field named; the local instance started while the config loaded
    (`toolbox.driver.local_ray.EarlyRay`) is shut down without a word."""
    out = subprocess.run([sys.executable, "-m", "toolbox.run", "learner.num_workers=3", f"trainer.run_root={tmp_path}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "learner.num_workers=3" in out.stderr and "do not split" in out.stderr
    assert "Started a local Ray instance" not in out.stderr
    assert not list(tmp_path.iterdir()), "a bad config must fail before the run directory is made"


def test_cli_exits_non_zero_naming_the_late_worker(tmp_path: Path) -> None:
    """A rollout call that overruns its timeout stops the run with the role and rank, not a hang."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    one_each = ["rollout.num_workers=1", "reward.num_workers=1", "learner.num_workers=1", "learner.strategy=single"]
    out = subprocess.run([sys.executable, "-m", "toolbox.run", "rollout.timeout_s=0.001", "trainer.total_steps=2",
                          *one_each, "callbacks=[]", f"trainer.run_root={tmp_path}"], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "rollout rank" in out.stderr and "did not finish within 0.001s" in out.stderr


@pytest.fixture
def ray_head() -> Iterator[tuple[dict[str, str], str]]:
    """A Ray head with token auth on this machine; stopped afterwards even if the test fails (its own
    ``ray start --block`` process, never ``ray stop``: other Ray instances on the machine stay up).

    Its temp dir is short: Ray's unix socket paths must stay under 107 bytes.
    """
    temp = tempfile.mkdtemp(prefix="rayh", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    port, dash = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    head = ["--head", "--num-cpus=4", f"--port={port}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
            "--include-dashboard=true", f"--temp-dir={temp}", "--disable-usage-stats",
            # the job agent's fixed default port (52365) may be held by another Ray instance on the machine
            f"--dashboard-agent-listen-port={free_port()}"]
    try:  # the GCS listens on this node's IP, not on 127.0.0.1
        start_node(head, {**env, "RAY_ADDRESS": f"{ray.util.get_node_ip_address()}:{port}"}, 1, procs)
        yield env, f"http://127.0.0.1:{dash}"
    finally:
        stop_nodes(procs)
        shutil.rmtree(temp, ignore_errors=True)


def submit_when_agent_ready(submit: list[str], env: dict[str, str], within_s: float = 180.0) -> subprocess.CompletedProcess:
    """``ray job submit``, again while the new head's dashboard agent is still starting (a loaded machine):
    Ray refuses such a job before creating it ("No available agent"), so a retry cannot run it twice."""
    deadline = time.monotonic() + within_s
    while True:
        out = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=600)
        if "No available agent to submit job" not in out.stderr or time.monotonic() > deadline:
            return out
        time.sleep(2.0)


def test_ray_job_submit_runs_the_experiment(ray_head: tuple[dict[str, str], str], tmp_path: Path) -> None:
    env, address = ray_head
    runs = tmp_path / "runs"
    submit = [str(BIN / "ray"), "job", "submit", "--address", address, "--",
              sys.executable, "-m", "toolbox.run", "experiment=grpo_tiny", "rollout.num_workers=2",
              "trainer.total_steps=3", "trainer.eval_every=0", f"trainer.run_root={runs}"]
    out = submit_when_agent_ready(submit, env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run_dir,) = [p for p in runs.iterdir() if p.name.startswith("grpo_tiny-")]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if s["event"] == "step_end"] == [1, 2, 3]
    assert (run_dir / "config.yaml").exists()
    # The driver runs on a cluster it did not start: the peak it reports is its own and says so.
    assert json.loads((run_dir / "memory.json").read_text())["whole_run"] is False
