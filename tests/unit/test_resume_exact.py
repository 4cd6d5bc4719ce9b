"""Exact resume, in-process (``ray.local_mode``): a run of N steps and a run resumed from its checkpoint at step k
produce bit-identical metrics from step k+1 on, for every algorithm family.

Each case is tiny (a few steps of the tiny model or CartPole). The same check on real Ray with the driver
killed by SIGKILL is in ``tests/integration/test_resume.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolbox.config import load_config
from toolbox.experiment import ExperimentBuilder

N, K = 4, 2
LOCAL = ["ray.local_mode=true", "learner.strategy=single", "learner.num_workers=1", "callbacks=[]",
         "trainer.eval_every=0", f"trainer.total_steps={N}", f"trainer.save_every={K}"]
CASES = {
    "grpo": ["experiment=grpo_tiny", "algorithm.prompts_per_step=4", "algorithm.group_size=4",
             "rollout.num_workers=2", "reward.num_workers=2", "learner.micro_batch_size=8"],
    "ppo": ["experiment=ppo_tiny", "algorithm.prompts_per_step=8", "rollout.num_workers=2", "learner.micro_batch_size=8"],
    "dpo": ["experiment=dpo_tiny", "algorithm.batch_size=8"],
    "sft": ["experiment=sft_tiny", "algorithm.batch_size=8"],
    "ppo_env": ["experiment=ppo_cartpole", "algorithm.steps_per_env=16", "algorithm.epochs=2",
                "algorithm.target_return=null", "trainer.eval_every=1", "algorithm.eval_episodes=2"],
}
TIMING = ("_s", "per_s", "_gb")  # wall-clock and memory readings differ between any two runs


def numbers(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.endswith(TIMING)}


def fit(tmp_path: Path, name: str, *overrides: str) -> Any:
    trainer = ExperimentBuilder(load_config([*LOCAL, f"trainer.run_root={tmp_path}", f"trainer.run_name={name}",
                                             *overrides])).build_trainer()
    trainer.fit()
    return trainer


@pytest.mark.parametrize("algorithm", sorted(CASES))
def test_resumed_run_repeats_the_uninterrupted_one_bit_for_bit(algorithm: str, tmp_path: Path) -> None:
    whole = fit(tmp_path, "whole", *CASES[algorithm])
    step_k = tmp_path / "whole" / "checkpoints" / f"step_{K}"
    resumed = fit(tmp_path, "resumed", *CASES[algorithm], f"trainer.resume_from={step_k}")
    assert len(whole.history) == N and len(resumed.history) == N - K
    for step, (want, got) in enumerate(zip(whole.history[K:], resumed.history), start=K + 1):
        assert numbers(got) == numbers(want), f"{algorithm}: step {step} differs after resuming from step {K}"
