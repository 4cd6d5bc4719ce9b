"""Exact resume, in-process (``ray.local_mode``): a run of N steps and a run resumed from its checkpoint at step k
produce bit-identical metrics from step k+1 on, for every algorithm family.

Each case is tiny (a few steps of the tiny model or CartPole). The same check with the driver killed by SIGKILL
right after its checkpoint (a subprocess per run; GRPO also on real Ray) is in ``tests/integration/test_resume.py``,
which compares with the uninterrupted runs here (`uninterrupted`: run once per session).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from tests.run_files import numbers
from toolbox.config import load_config
from toolbox.driver.experiment import ExperimentBuilder

N, K = 4, 2
LOCAL = ["ray.local_mode=true", "learner.strategy=single", "learner.num_workers=1", "callbacks=[]",
         "trainer.eval_every=0", f"trainer.total_steps={N}", f"trainer.save_every={K}"]
CASES = {
    "grpo": ["experiment=grpo_tiny_fsdp2", "algorithm.prompts_per_step=4", "algorithm.group_size=4",
             "rollout.num_workers=2", "reward.num_workers=2", "learner.micro_batch_size=8"],
    # The default recipe: blocks of 2 steps sampled up to 3 ahead, so the checkpoint of step K holds batches in flight.
    "grpo_ahead": ["experiment=grpo_tiny"],
    "ppo": ["experiment=ppo_tiny", "algorithm.prompts_per_step=8", "rollout.num_workers=2", "learner.micro_batch_size=8"],
    "dpo": ["experiment=dpo_tiny", "algorithm.batch_size=8"],
    "sft": ["experiment=sft_tiny", "algorithm.batch_size=8"],
    "ppo_env": ["experiment=ppo_cartpole", "algorithm.steps_per_env=16", "algorithm.epochs=2",
                "algorithm.target_return=null", "trainer.eval_every=1", "algorithm.eval_episodes=2"],
    # Continuous actions with observation normalisation and reward scaling: the running statistics (model
    # buffers) and the runners' per-env discounted returns must resume exactly too.
    "ppo_env_normalised": ["experiment=ppo_pendulum", "algorithm.steps_per_env=16", "algorithm.epochs=2",
                           "algorithm.minibatches=4", "algorithm.target_return=null", "algorithm.policy.normalize_obs=true",
                           "algorithm.scale_rewards=true", "env.num_envs=2"],
}


def fit(tmp_path: Path, name: str, *overrides: str) -> Any:
    trainer = ExperimentBuilder(load_config([*LOCAL, f"trainer.run_root={tmp_path}", f"trainer.run_name={name}",
                                             *overrides])).build_trainer()
    trainer.fit()
    return trainer


@functools.cache
def _uninterrupted(algorithm: str, root: Path) -> tuple[list[dict[str, float]], Path]:
    return fit(root, algorithm, *CASES[algorithm]).history, root / algorithm


def uninterrupted(algorithm: str, factory: pytest.TempPathFactory) -> tuple[list[dict[str, float]], Path]:
    """The N-step run of ``CASES[algorithm]`` (its metrics and run directory), run once per session: the resume
    below and the SIGKILL resume of ``tests/integration/test_resume.py`` both compare with it."""
    return _uninterrupted(algorithm, factory.getbasetemp() / "uninterrupted")


@pytest.mark.parametrize("algorithm", sorted(CASES))
def test_resumed_run_repeats_the_uninterrupted_one_bit_for_bit(algorithm: str, tmp_path: Path,
                                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    whole, whole_dir = uninterrupted(algorithm, tmp_path_factory)
    step_k = whole_dir / "checkpoints" / f"step_{K}"
    resumed = fit(tmp_path, "resumed", *CASES[algorithm], f"trainer.resume_from={step_k}")
    assert len(whole) == N and len(resumed.history) == N - K
    for step, (want, got) in enumerate(zip(whole[K:], resumed.history), start=K + 1):
        assert numbers(got) == numbers(want), f"{algorithm}: step {step} differs after resuming from step {K}"


def test_batches_sampled_ahead_that_the_resumed_plan_would_not_take_are_sampled_again(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture) -> None:
    """The default recipe's checkpoint holds steps 3-4 sampled with the initial weights; resumed synchronously
    (``rollout.max_staleness=0``), those batches lag too much for the run's plan: dropped, said, sampled anew."""
    _, whole_dir = uninterrupted("grpo_ahead", tmp_path_factory)
    resumed = fit(tmp_path, "sync", *CASES["grpo_ahead"], "rollout.max_staleness=0", "rollout.steps_per_generation=1",
                  f"trainer.resume_from={whole_dir / 'checkpoints' / f'step_{K}'}")
    assert f"steps {[K, K + 1]} are sampled again" in caplog.text
    assert [m["staleness"] for m in resumed.history] == [0.0] * (N - K)
