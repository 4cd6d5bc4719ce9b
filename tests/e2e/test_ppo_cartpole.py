"""The real CLI: ``python -m toolbox.run experiment=ppo_cartpole`` reaches 475 and leaves its results in the run dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_ppo_cartpole_reaches_475(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"RAY_ADDRESS", "RAY_AUTH_MODE"}}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "toolbox.run", "experiment=ppo_cartpole", f"trainer.run_root={tmp_path}",
         "trainer.run_name=cartpole", "ray.num_cpus=4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "cartpole"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r["metrics"]["eval_return"] for r in records if r["event"] == "eval_end"]
    steps = [r["metrics"] for r in records if r["event"] == "step_end"]
    assert evals and evals[-1] >= 475, evals
    assert {"env_steps", "episode_return", "policy_loss", "value_loss", "env_steps_per_s"} <= set(steps[-1])
    assert (run_dir / "return_curve.png").stat().st_size > 0 and (run_dir / "config.yaml").exists()
    assert "reached_target" in proc.stderr and "True" in proc.stderr  # the summary table
    assert elapsed < 300, f"took {elapsed:.0f}s"
