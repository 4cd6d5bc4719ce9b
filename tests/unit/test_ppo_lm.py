"""Language-model PPO: token rewards, token-level GAE, the learner with its critic."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.unit.learner_steps import online_step
from toolbox.algorithms.ppo.config import PPOConfig
from toolbox.algorithms.ppo.learner import PPOLearner
from toolbox.learner.config import LearnerConfig
from toolbox.objectives.ppo_lm import token_gae, token_rewards
from toolbox.objectives.value import clipped_value_terms
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


def test_token_rewards_put_the_score_on_the_last_token_and_kl_on_every_token() -> None:
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 9.0, 9.0]])
    r = token_rewards(torch.tensor([1.0, 2.0]), mask, kl, kl_coef=0.5)
    assert torch.allclose(r, torch.tensor([[-0.05, -0.1, 1.0 - 0.15], [2.0 - 0.25, 0.0, 0.0]]))


def test_token_gae_matches_a_hand_computation() -> None:
    mask = torch.tensor([[1, 1, 0]])
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.25, 0.0]])
    gamma, lam = 0.9, 0.8
    adv, ret = token_gae(rewards, values, mask, gamma, lam)
    d1 = 1.0 - 0.25  # last token: no bootstrap
    d0 = 0.0 + gamma * 0.25 - 0.5
    assert torch.allclose(adv, torch.tensor([[d0 + gamma * lam * d1, d1, 0.0]]))
    assert torch.allclose(ret, (adv + values) * mask)


def test_clipped_value_terms_take_the_pessimistic_side() -> None:
    v, old, ret = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([0.0, 1.0])
    assert torch.allclose(clipped_value_terms(v, old, ret, clip=0.2), torch.tensor([0.5, 0.5]))
    assert torch.allclose(clipped_value_terms(v, old, ret, clip=0.0), torch.tensor([0.5, 0.5]))
    assert torch.allclose(clipped_value_terms(torch.tensor([0.5]), old[:1], torch.tensor([1.0]), 0.2),
                          torch.tensor([0.5 * 0.8**2]))


def _batch(rows: int = 4) -> RolloutBatch:
    gen = torch.Generator().manual_seed(0)
    return RolloutBatch(
        prompt_ids_BP=torch.randint(3, 15, (rows, 4), generator=gen), prompt_mask_BP=torch.ones(rows, 4, dtype=torch.long),
        response_ids_BR=torch.randint(3, 15, (rows, 3), generator=gen),
        response_mask_BR=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]][:rows]),
        logprobs_BR=torch.zeros(rows, 3), group_B=torch.arange(rows), finish_B=torch.zeros(rows, dtype=torch.long),
    )


def test_ppo_learner_updates_policy_and_critic_and_checkpoints_both(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=2)
    algo = PPOConfig(prompts_per_step=4, kl_coef=0.1, ppo_epochs=2)
    learner = PPOLearner(str(tiny_model_dir), "float32", cfg, algo, total_steps=3)
    head_before = learner.critic.module.head.weight.detach().clone()
    policy_before = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    rewards = RewardResult(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long), [""] * 4)
    metrics = online_step(learner, [_batch()], [rewards])
    assert {"pg_loss", "vf_loss", "kl", "critic_grad_norm", "reward"} <= metrics.keys()
    assert not torch.equal(learner.critic.module.head.weight, head_before), "the critic did not train"
    assert any(not torch.equal(v, policy_before[k]) for k, v in learner.policy.model.state_dict().items())
    learner.policy.save(tmp_path / "step_1")
    fresh = PPOLearner(str(tiny_model_dir), "float32", cfg, algo, total_steps=3)
    assert fresh.policy.load(tmp_path / "step_1") == 1
    assert torch.equal(fresh.critic.module.head.weight, learner.critic.module.head.weight)
