"""Exact resume on real Ray: a GRPO driver (``python -m toolbox.run``) killed by SIGKILL after its checkpoint at
step 5, while running steps 8-10, and started again with ``trainer.resume_from=auto`` repeats steps 6-7 of its
first life bit for bit (the first life is the uninterrupted reference: it saw those steps before it was killed).

One worker per role, to keep it cheap (each run starts its actors afresh): what Ray mode adds over the
in-process cases of ``tests/unit/test_resume_exact.py`` is that every role has its own process and RNG
streams, and the rollout worker's sampling stream must come back from the checkpoint. The driver
subprocesses join this session's Ray instance, so the killed driver's actors die with its job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from toolbox.trainers.checkpoints import latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN = ["experiment=grpo_tiny", "algorithm.prompts_per_step=4", "algorithm.group_size=4", "rollout.num_workers=1",
       "reward.num_workers=1", "learner.num_workers=1", "learner.strategy=single", "learner.micro_batch_size=8",
       "trainer.eval_every=0", "trainer.total_steps=10", "trainer.save_every=5", "callbacks=[{name: jsonl}]",
       "trainer.run_name=killed", "trainer.resume_from=auto"]
TIMING = ("_s", "per_s", "_gb")  # wall-clock and memory readings differ between any two runs


def numbers(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not k.endswith(TIMING)}


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(run_dir: Path, event: str, step: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(r["event"] == event and r["step"] == step for r in records(run_dir)):
            return
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before {event} {step}"
        time.sleep(0.05)
    pytest.fail(f"no {event} {step} within {timeout_s} s")


def test_grpo_killed_with_sigkill_resumes_auto_bit_for_bit(ray_session: None, tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "toolbox.run", *RUN, f"trainer.run_root={tmp_path}",
               f"ray.address={ray.get_runtime_context().gcs_address}"]
    with (tmp_path / "first.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(run_dir, "step_end", 7, proc, timeout_s=300)  # checkpoint 5 is written, 3 steps to the next
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step_5", "the driver was not killed in steps 8-10"
    first = {r["step"]: r["metrics"] for r in records(run_dir) if r["event"] == "step_end"}

    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed = [r for r in records(run_dir) if r["event"] == "step_end"][len(first):]
    assert [r["step"] for r in resumed] == [6, 7, 8, 9, 10]
    compared = [r["step"] for r in resumed if r["step"] in first]  # 6, 7 and whatever else ran before the kill
    assert compared[:2] == [6, 7]
    for r in resumed[:len(compared)]:
        assert numbers(r["metrics"]) == numbers(first[r["step"]]), f"step {r['step']} differs after the resume"
    assert latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step_10"
