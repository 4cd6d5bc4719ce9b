"""Online DPO: pairs from sampled groups, and one learner step."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.unit.learner_steps import online_step
from toolbox.algorithms.online_dpo.config import OnlineDPOConfig
from toolbox.algorithms.online_dpo.learner import OnlineDPOLearner
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.learner.config import LearnerConfig
from toolbox.objectives.online_dpo import best_worst_pairs
from toolbox.objectives.preference import dpo_loss
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
    with pytest.raises(ConfigError, match=r"algorithm\.loss\.name: 'ppo_clip' is a policy loss; this algorithm takes a "
                                          r"preference loss"):
        load_config(["experiment=online_dpo_tiny", "algorithm.loss.name=ppo_clip"])


@pytest.mark.parametrize(("override", "message"), [
    ("algorithm.ppo_epochs=2", r"algorithm\.ppo_epochs: Extra inputs are not permitted \(got 2\)"),
    ("algorithm.loss.clip_high=0.3", r"algorithm\.loss\.clip_high: Extra inputs are not permitted \(got 0\.3\)"),
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


class _FixedLogits(torch.nn.Module):
    """A causal LM whose every position has the logits ``[w, 0, 0, 0]``: token 0 has probability
    ``e^w / (e^w + 3)``, each other token ``1 / (e^w + 3)``, whatever the context."""

    def __init__(self, w: float) -> None:
        super().__init__()
        self.w = w

    def forward(self, input_ids: torch.Tensor, **_: object) -> SimpleNamespace:
        logits = torch.zeros(*input_ids.shape, 4)
        logits[..., 0] = self.w
        return SimpleNamespace(logits=logits)


@pytest.mark.parametrize(("loss_type", "want"), [
    # Policy (w = ln 3): p(0) = 1/2, p(1) = p(2) = 1/6; reference (w = 0): every token 1/4.
    # Chosen: own tokens 0 and 0 (the env's 1, 2 between them do not count): pi = 2 ln(1/2), ref = 2 ln(1/4).
    # Rejected: own tokens 1, 2 then padding: pi = 2 ln(1/6), ref = 2 ln(1/4).
    # sigmoid: h = (2 ln(1/2) - 2 ln(1/6)) - 0 = 2 ln 3, loss = -log sigma(0.5 * 2 ln 3) = -log(3/4).
    ("sigmoid", math.log(4 / 3)),
    # ipo (per-own-token means): h = (ln(1/2) - ln(1/6)) - 0 = ln 3, loss = (ln 3 - 1 / (2 * 0.5))^2.
    ("ipo", (math.log(3) - 1.0) ** 2),
])
def test_pair_log_probs_count_only_the_models_own_tokens(tiny_model_dir: Path, loss_type: str, want: float) -> None:
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=2)
    algo = OnlineDPOConfig(prompts_per_step=1, group_size=2, beta=0.5, loss={"name": loss_type})
    learner = OnlineDPOLearner(str(tiny_model_dir), "float32", cfg, algo, total_steps=1)
    rows = RolloutBatch(
        prompt_ids_BP=torch.full((2, 2), 3), prompt_mask_BP=torch.ones(2, 2, dtype=torch.long),
        response_ids_BR=torch.tensor([[0, 1, 2, 0], [1, 2, 3, 3]]),
        response_mask_BR=torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
        own_mask_BR=torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1]]),  # chosen: call, 2 env tokens, answer
        logprobs_BR=torch.zeros(2, 4), group_B=torch.zeros(2, dtype=torch.long), finish_B=torch.zeros(2, dtype=torch.long),
    )
    policy, ref = (learner._seq_logps(_FixedLogits(w), rows) for w in (math.log(3), 0.0))
    scale = 0.5 if loss_type == "ipo" else 1.0  # IPO averages over the 2 own tokens of each row
    torch.testing.assert_close(policy, scale * torch.tensor([2 * math.log(1 / 2), 2 * math.log(1 / 6)]))
    torch.testing.assert_close(ref, scale * torch.tensor([2 * math.log(1 / 4)] * 2))
    loss = dpo_loss(policy[:1], policy[1:], ref[:1], ref[1:], algo.beta, loss_type)
    assert loss.item() == pytest.approx(want, rel=1e-5)
