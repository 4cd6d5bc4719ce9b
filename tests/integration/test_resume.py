"""Exact resume after a SIGKILL: a driver (``python -m toolbox.run``) killed after a checkpoint and started again with
``trainer.resume_from=auto`` repeats the uninterrupted run's metrics bit for bit.

GRPO on real Ray: killed after its checkpoint at step 5, while running steps 8-10; its first life is the
uninterrupted reference (it saw steps 6-7 before it was killed). One worker per role, to keep it cheap (each run
starts its actors afresh): what Ray mode adds over the in-process cases of ``tests/unit/test_resume_exact.py`` is
that every role has its own process and RNG streams, and the rollout worker's sampling stream must come back from
the checkpoint. The driver subprocesses join this session's Ray instance, so the killed driver's actors die with
its job.

PPO, DPO, SFT and PPO on CartPole: the recipes of ``tests/unit/test_resume_exact.py`` in local mode (every role in
the driver's process: a subprocess without Ray starts in seconds), killed the moment the step-2 checkpoint is
complete, resumed, and compared from step 3 on with that file's uninterrupted runs (shared: run once per session).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from tests.run_files import numbers, records, steps, wait_for
from tests.unit.test_resume_exact import CASES, LOCAL, K, N, uninterrupted
from toolbox.trainers.checkpoints import COMPLETE, latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN = ["experiment=grpo_tiny_fsdp2", "algorithm.prompts_per_step=4", "algorithm.group_size=4", "rollout.num_workers=1",
       "reward.num_workers=1", "learner.num_workers=1", "learner.strategy=single", "learner.micro_batch_size=8",
       "trainer.eval_every=0", "trainer.total_steps=10", "trainer.save_every=5", "callbacks=[{name: jsonl}]",
       "trainer.run_name=killed", "trainer.resume_from=auto"]


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
    first = steps(run_dir)

    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed = [r for r in records(run_dir) if r["event"] == "step_end"][len(first):]
    assert [r["step"] for r in resumed] == [6, 7, 8, 9, 10]
    compared = [r["step"] for r in resumed if r["step"] in first]  # 6, 7 and whatever else ran before the kill
    assert compared[:2] == [6, 7]
    for r in resumed[:len(compared)]:
        assert numbers(r["metrics"]) == numbers(first[r["step"]]), f"step {r['step']} differs after the resume"
    assert latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step_10"


KILLED = ["dpo", "ppo", "ppo_env", "sft"]  # grpo: killed on real Ray above


def killed_run(algorithm: str, root: Path) -> tuple[list[str], Path]:
    """The command of ``CASES[algorithm]`` as a local-mode driver that resumes its own run directory, and that
    directory."""
    return [sys.executable, "-m", "toolbox.run", *LOCAL, *CASES[algorithm], "callbacks=[{name: jsonl}]",
            f"trainer.run_root={root}", f"trainer.run_name={algorithm}", "trainer.resume_from=auto"], root / algorithm


def kill_at_markers(runs: dict[str, tuple[subprocess.Popen[Any], Path]], timeout_s: float = 300.0) -> None:
    """SIGKILL each run the moment its marker file exists (all watched at once); fails if one exits first."""
    deadline = time.monotonic() + timeout_s
    alive = dict(runs)
    while alive:
        for name, (proc, marker) in list(alive.items()):
            if marker.exists():
                os.kill(proc.pid, signal.SIGKILL)
                del alive[name]
            else:
                assert proc.poll() is None, f"{name}: exited ({proc.returncode}) before {marker} was written"
        assert time.monotonic() < deadline, f"no {[str(m) for _, m in alive.values()]} within {timeout_s} s"
        time.sleep(0.005)


def test_killed_right_after_a_checkpoint_resumes_bit_for_bit(tmp_path: Path,
                                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each algorithm's driver is killed (SIGKILL) the moment its step-2 checkpoint is complete, started again, and
    its steps 3-4 compared with the uninterrupted run's. The four drivers of each life run side by side: each is
    one mostly single-threaded process, so they share the cores instead of queueing for one."""
    whole = {algorithm: uninterrupted(algorithm, tmp_path_factory)[0] for algorithm in KILLED}
    runs = {algorithm: killed_run(algorithm, tmp_path) for algorithm in KILLED}
    logs = {algorithm: (tmp_path / f"{algorithm}.log").open("w") for algorithm in KILLED}
    procs = {a: subprocess.Popen(runs[a][0], stdout=logs[a], stderr=subprocess.STDOUT) for a in KILLED}
    try:
        kill_at_markers({a: (procs[a], runs[a][1] / "checkpoints" / f"step_{K}" / COMPLETE) for a in KILLED})
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        for log in logs.values():
            log.close()
    lived = {}
    for algorithm, (_, run_dir) in runs.items():
        assert latest_checkpoint(run_dir) == run_dir / "checkpoints" / f"step_{K}", \
            f"{algorithm}: killed too late (after step {N}'s checkpoint)"
        lived[algorithm] = len(records(run_dir))

    second = {a: subprocess.Popen(runs[a][0], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for a in KILLED}
    try:
        for algorithm, proc in second.items():
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"{algorithm}: {out[-3000:]}"
            resumed = [r for r in records(runs[algorithm][1])[lived[algorithm]:] if r["event"] == "step_end"]
            assert [r["step"] for r in resumed] == list(range(K + 1, N + 1)), algorithm
            for r, want in zip(resumed, whole[algorithm][K:]):
                assert numbers(r["metrics"]) == numbers(want), f"{algorithm}: step {r['step']} differs after the resume"
    finally:
        for proc in second.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
