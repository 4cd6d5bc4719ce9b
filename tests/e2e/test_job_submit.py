"""End to end: the real CLI, and ``ray start --head`` + ``ray job submit`` with token authentication."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_rejects_bad_config_before_starting_anything(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "toolbox.run", "learner.num_workers=3", f"trainer.run_root={tmp_path}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "learner.num_workers=3" in out.stderr and "do not split" in out.stderr
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
    """A Ray head with token auth on this machine; stopped afterwards even if the test fails.

    Its temp dir is short: Ray's unix socket paths must stay under 107 bytes.
    """
    temp = tempfile.mkdtemp(prefix="rayh", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    dash = free_port()
    start = [str(BIN / "ray"), "start", "--head", "--num-cpus=4", f"--port={free_port()}",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--include-dashboard=true",
             f"--temp-dir={temp}"]
    subprocess.run(start, env=env, check=True, capture_output=True, timeout=180)
    try:
        yield env, f"http://127.0.0.1:{dash}"
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


def submit_when_agent_ready(submit: list[str], env: dict[str, str], within_s: float = 90.0) -> subprocess.CompletedProcess:
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
