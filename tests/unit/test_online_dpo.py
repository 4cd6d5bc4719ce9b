"""Online DPO: pairs from sampled groups, and one learner step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.unit.learner_steps import online_step
from toolbox.algorithms.online_dpo.config import OnlineDPOConfig
from toolbox.algorithms.online_dpo.learner import OnlineDPOLearner
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.learner.config import LearnerConfig
from toolbox.objectives.online_dpo import best_worst_pairs
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


def test_best_worst_pairs_skip_ties_and_unscored_samples() -> None:
    rewards = torch.tensor([0.0, 1.0, 0.5, 1.0, 1.0, 1.0, 3.0, 0.0, 9.0])
    ok = torch.tensor([True, True, True, True, True, True, True, True, False])
    chosen, rejected, weight = best_worst_pairs(rewards, ok, group_size=3)
    assert chosen.tolist()[0] == 1 and rejected.tolist()[0] == 0
    assert weight.tolist() == [1.0, 0.0, 1.0]  # group 1 all equal; group 2's 9.0 errored and is ignored
    assert (chosen[2].item(), rejected[2].item()) == (6, 7)


def test_wrong_family_loss_names_both_sides() -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.loss_type: .*'grpo' is a policy objective; the 'online_dpo' trainer "
                                          r"takes preference objectives"):
        load_config(["experiment=online_dpo_tiny", "algorithm.loss_type=grpo"])


@pytest.mark.parametrize(("override", "message"), [
    ("algorithm.ppo_epochs=2", r"algorithm\.ppo_epochs: Extra inputs are not permitted \(got 2\)"),
    ("algorithm.clip_high=0.3", r"algorithm\.clip_high: Extra inputs are not permitted \(got 0\.3\)"),
])
def test_policy_loop_fields_are_refused(override: str, message: str) -> None:
    # Online DPO has no PPO epochs and no ratio clipping: such a field is an error naming it, not ignored.
    with pytest.raises(ConfigError, match=message):
        load_config(["experiment=online_dpo_tiny", override])


def test_batch_arithmetic_counts_rollouts_per_rank() -> None:
    # online_dpo_tiny: 32 prompts x 4 samples over 2 ranks = 64 rollouts per rank.
    with pytest.raises(ConfigError, match=r"each learner rank gets 64 rollouts per step, .*learner\.micro_batch_size=7; "
                                          r"64 must be a multiple of 7"):
        load_config(["experiment=online_dpo_tiny", "learner.micro_batch_size=7"])


def test_first_step_loss_is_log_two_and_the_policy_moves(tiny_model_dir: Path) -> None:
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=2)
    algo = OnlineDPOConfig(prompts_per_step=2, group_size=2, beta=0.1)
    learner = OnlineDPOLearner(str(tiny_model_dir), "float32", cfg, algo, total_steps=2)
    gen = torch.Generator().manual_seed(0)
    batch = RolloutBatch(
        prompt_ids_BP=torch.randint(3, 15, (4, 3), generator=gen), prompt_mask_BP=torch.ones(4, 3, dtype=torch.long),
        response_ids_BR=torch.randint(3, 15, (4, 2), generator=gen), response_mask_BR=torch.ones(4, 2, dtype=torch.long),
        logprobs_BR=torch.zeros(4, 2), group_B=torch.tensor([0, 0, 1, 1]), finish_B=torch.zeros(4, dtype=torch.long),
    )
    rewards = RewardResult(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long), [""] * 4)
    before = [p.detach().clone() for p in learner.policy.model.parameters()]
    metrics = online_step(learner, [batch], [rewards])
    assert metrics["pairs"] == 2.0
    assert math.isclose(metrics["dpo_loss"], math.log(2), rel_tol=1e-5)  # policy == reference at the first step
    assert any(not torch.equal(p, b) for p, b in zip(learner.policy.model.parameters(), before))
