"""The multi-turn loss mask: env/tool tokens are out of the policy loss (by hand on 2 rows), and the GRPO learner
trains on the model's own tokens only, while still attending to the env's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.learner_steps import online_step
from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.grpo.learner import GRPOLearner
from toolbox.learner.config import LearnerConfig
from toolbox.models.loading import load_tokenizer
from toolbox.objectives.grpo import grpo_loss
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import FINISH_STOP, RolloutBatch

# Row 0: model, model, env, env, model (advantage +1). Row 1: model, env, env, model, padding (advantage -1).
LOSS_MASK = torch.tensor([[1, 1, 0, 0, 1], [1, 0, 0, 1, 0]])
RESPONSE_MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
# Ratios on the model's tokens; env tokens get absurd ratios (their behaviour log-prob is 0) that must not count.
RATIO = torch.tensor([[1.5, 1.0, 50.0, 50.0, 0.5], [1.5, 50.0, 50.0, 0.5, 1.0]])


def test_masked_grpo_loss_by_hand() -> None:
    old = torch.full((2, 5), -1.0)
    logp = (old + RATIO.log()).requires_grad_()
    terms = grpo_loss(logp, old, None, torch.tensor([1.0, -1.0]), LOSS_MASK, token_count=5, seq_count=2,
                      norm_length=5, clip_low=0.2, clip_high=0.28)
    # Per model token, -min(r * A, clip(r, 0.8, 1.28) * A):
    # row 0 (A=+1): r=1.5 -> -1.28, r=1.0 -> -1.0, r=0.5 -> -0.5; row 1 (A=-1): r=1.5 -> +1.5, r=0.5 -> +0.8.
    assert terms.pg_loss == pytest.approx((-1.28 - 1.0 - 0.5 + 1.5 + 0.8) / 5)
    assert terms.clip_frac == pytest.approx(2 / 5)  # row 0's r=1.5 and row 1's r=0.5 are clipped
    terms.loss.backward()
    # d/dlogp of -r*A is -r*A where unclipped, 0 where clipped; 0 on every env token.
    expected = torch.tensor([[0.0, -1.0, 0, 0, -0.5], [1.5, 0, 0, 0.0, 0]]) / 5
    torch.testing.assert_close(logp.grad, expected)


def _episode_batch(tok, env_tail: str) -> RolloutBatch:  # noqa: ANN001 - transformers type
    """Two rows of one group from prompt ``1+2=``: model tokens, an env reply, model tokens, and an env tail."""
    def ids(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    prompt = ids("1+2=")
    rows = [(ids("3") + ids("=4") + ids("3+") + ids(env_tail), [1, 0, 0, 1, 1] + [0] * len(env_tail)),
            (ids("9") + ids("==1") + ids(env_tail), [1, 0, 0, 0] + [0] * len(env_tail))]
    width = max(len(r) for r, _ in rows)
    pad = lambda x: x + [0] * (width - len(x))  # noqa: E731
    return RolloutBatch(
        prompt_ids_BP=torch.tensor([prompt, prompt]), prompt_mask_BP=torch.ones(2, len(prompt), dtype=torch.long),
        response_ids_BR=torch.tensor([pad(r) for r, _ in rows]),
        response_mask_BR=torch.tensor([pad([1] * len(r)) for r, _ in rows]),
        logprobs_BR=torch.zeros(2, width), group_B=torch.tensor([0, 0]),
        finish_B=torch.tensor([FINISH_STOP, FINISH_STOP]), own_mask_BR=torch.tensor([pad(m) for _, m in rows]))


def _learner(path: Path) -> GRPOLearner:
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=1,
                        optim={"lr": 1e-2, "scheduler": "constant", "max_grad_norm": 100.0})
    algo = GRPOConfig(prompts_per_step=1, group_size=2, kl_coef=0.0, ppo_epochs=1, mini_batches=1)
    torch.manual_seed(0)
    return GRPOLearner(str(path), "float32", cfg, algo, total_steps=1)


def test_grpo_learner_trains_on_model_tokens_only(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(str(tiny_model_dir))
    rewards = [RewardResult(torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long), ["", ""])]
    first, second = _learner(tiny_model_dir), _learner(tiny_model_dir)
    m = online_step(first, [_episode_batch(tok, "+1")], rewards)
    # On-policy (ratio 1): pg = -(sum of A over the model's tokens) / (their count) = -(3a - 1a) / 4 = -a / 2,
    # where a = |A| of the 2-row group. Counting env tokens too would give -(7a - 6a) / 13.
    assert m["pg_loss"] == pytest.approx(-m["adv_abs"] / 2, rel=1e-5)
    # Env tokens after the last model token influence no model token: changing them leaves the update unchanged.
    online_step(second, [_episode_batch(tok, "=0")], rewards)
    a, b = first.policy.full_state_dict(), second.policy.full_state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_own_mask_survives_concat_select_split() -> None:
    def rows(own: torch.Tensor | None, width: int) -> RolloutBatch:
        mask = torch.ones(2, width, dtype=torch.long)
        return RolloutBatch(torch.ones(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long), mask.clone(), mask,
                            torch.zeros(2, width), torch.tensor([0, 1]), torch.zeros(2, dtype=torch.long),
                            own_mask_BR=own)

    episodes, single = rows(torch.tensor([[1, 0, 1], [0, 1, 1]]), 3), rows(None, 2)
    assert torch.equal(single.loss_mask_BR, single.response_mask_BR) and single.own_mask_BR is None
    both = RolloutBatch.concat([episodes, single])
    assert both.loss_mask_BR.tolist() == [[1, 0, 1], [0, 1, 1], [1, 1, 0], [1, 1, 0]]
    assert both.select(torch.tensor([1])).loss_mask_BR.tolist() == [[0, 1, 1]]
    assert [s.loss_mask_BR.tolist() for s in both.split(2)][0] == [[1, 0, 1], [0, 1, 1]]
    assert RolloutBatch.concat([single, single]).own_mask_BR is None
    both.response_mask_BR = both.response_mask_BR * torch.tensor([[1], [0], [1], [1]])  # a learner drops row 1
    assert both.loss_mask_BR[1].tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match=r"own_mask_BR has shape \(2, 2\), expected \(2, 3\)"):
        rows(torch.ones(2, 2, dtype=torch.long), 3)
