"""`toolbox.objectives.grpo`: the loss by hand, its advantages, and micro-batch accumulation invariance."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.core.errors import RegistryError
from toolbox.objectives.grpo import grpo_loss
from toolbox.rl.advantages import group_normalized, grpo_advantages, rloo

AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

# Same hand case as test_policy: per-token loss [[-1.3, -0.5, (masked)], [1.5, 0.8, 1.2]], clip on two tokens.
OLD_BT = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]])
LOGP_BT = OLD_BT + torch.tensor([[1.5, 0.5, 1.0], [1.5, 0.5, 1.2]]).log()
ADV_B = torch.tensor([1.0, -1.0])
MASK_BT = torch.tensor([[1, 1, 0], [1, 1, 1]])
# logp - ref: k2 = 0.5 * d^2 = [[0.02, 0.08, (masked)], [0.0, 0.02, 0.18]]
REF_BT = LOGP_BT - torch.tensor([[0.2, 0.4, 9.0], [0.0, -0.2, 0.6]])


def cfg(**kw) -> dict[str, Any]:  # noqa: ANN003
    """The loss options of a GRPO config (validated by it), as `grpo_loss` keywords."""
    base = {"clip_low": 0.2, "clip_high": 0.3, "kl_coef": 0.1, "kl_kind": "k2", "agg": "token-mean"}
    options = {**base, **kw}
    loss = {k: options[k] for k in ("clip_low", "clip_high", "agg")}
    GRPOConfig(kl_coef=options["kl_coef"], kl_kind=options["kl_kind"], loss=loss)
    return options


def test_grpo_loss_hand_case_with_kl() -> None:
    terms = grpo_loss(LOGP_BT, OLD_BT, REF_BT, ADV_B, MASK_BT, token_count=5, seq_count=2, norm_length=3, **cfg())
    assert terms.pg_loss == pytest.approx(1.7 / 5)
    assert terms.kl == pytest.approx(0.3 / 5)
    assert terms.loss.item() == pytest.approx(1.7 / 5 + 0.1 * 0.3 / 5)
    assert terms.clip_frac == pytest.approx(2 / 5)


def test_grpo_loss_seq_mean_aggregation() -> None:
    terms = grpo_loss(LOGP_BT, OLD_BT, REF_BT, ADV_B, MASK_BT, 5, 2, 3, **cfg(agg="seq-mean-token-mean"))
    assert terms.pg_loss == pytest.approx((-1.8 / 2 + 3.5 / 3) / 2)
    assert terms.kl == pytest.approx((0.1 / 2 + 0.2 / 3) / 2)
    assert terms.clip_frac == pytest.approx(2 / 5)  # always a token fraction


def test_kl_term_skipped_without_reference_or_coefficient() -> None:
    for config, ref in ((cfg(kl_coef=0.0), REF_BT), (cfg(), None)):
        terms = grpo_loss(LOGP_BT, OLD_BT, ref, ADV_B, MASK_BT, 5, 2, 3, **config)
        assert terms.kl == 0.0 and terms.loss.item() == pytest.approx(1.7 / 5)


def test_grpo_advantages_flatten_groups() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 2.0])
    adv, used = grpo_advantages(rewards, 4, "group_norm")
    torch.testing.assert_close(adv, group_normalized(rewards.view(2, 4)).reshape(-1))
    assert used.all()
    torch.testing.assert_close(grpo_advantages(rewards, 4, "rloo")[0], rloo(rewards.view(2, 4)).reshape(-1))
    torch.testing.assert_close(grpo_advantages(rewards, 2, "group_mean")[0],
                               torch.tensor([0.5, -0.5, -0.5, 0.5, 1, -1, 0, 0.0]))


def test_grpo_advantages_errors() -> None:
    with pytest.raises(ValueError, match="7 rewards do not split into groups of 4"):
        grpo_advantages(torch.zeros(7), 4, "group_norm")
    with pytest.raises(RegistryError, match="unknown advantage 'nope'"):
        grpo_advantages(torch.zeros(8), 4, "nope")


class LinearPolicy(torch.nn.Module):
    """A tiny "policy": per-position features -> logits over a 6-token vocabulary -> log-prob of the taken token."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(4, 6)

    def forward(self, feats_BTD: torch.Tensor, tokens_BT: torch.Tensor) -> torch.Tensor:
        logits = self.proj(feats_BTD)
        return torch.log_softmax(logits, -1).gather(-1, tokens_BT.unsqueeze(-1)).squeeze(-1)


def make_data() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    b, t = 8, 5
    lengths = torch.tensor([1, 5, 3, 2, 5, 4, 1, 3])
    return {
        "feats": torch.randn(b, t, 4, generator=gen),
        "tokens": torch.randint(0, 6, (b, t), generator=gen),
        "mask": (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).long(),
        "adv": torch.randn(b, generator=gen),
        # Behaviour and reference log-probs a little off the current policy, so ratios clip somewhere.
        "noise": 0.4 * torch.randn(b, t, generator=gen),
        "ref_noise": 0.3 * torch.randn(b, t, generator=gen),
    }


def grads_of(config: dict[str, Any], micro: int, global_counts: bool = True) -> tuple[list[torch.Tensor], float]:
    policy, d = LinearPolicy(), make_data()
    with torch.no_grad():
        logp0 = policy(d["feats"], d["tokens"])
    old, ref = logp0 + d["noise"], logp0 + d["ref_noise"]
    tokens, seqs, width = float(d["mask"].sum()), float(d["mask"].shape[0]), float(d["mask"].shape[1])
    total = 0.0
    for start in range(0, 8, micro):
        rows = slice(start, start + micro)
        logp = policy(d["feats"][rows], d["tokens"][rows])
        counts = (tokens, seqs) if global_counts else (float(d["mask"][rows].sum()), float(micro))
        terms = grpo_loss(logp, old[rows], ref[rows], d["adv"][rows], d["mask"][rows], *counts, width, **config)
        terms.loss.backward()
        total += terms.loss.item()
    return [p.grad.clone() for p in policy.parameters()], total


@pytest.mark.parametrize("agg", AGGS)
def test_micro_batch_accumulation_equals_one_batch(agg: str) -> None:
    config = cfg(agg=agg, kl_coef=0.05, kl_kind="k3")
    full, full_loss = grads_of(config, micro=8)
    accum, accum_loss = grads_of(config, micro=1)
    for g_full, g_accum in zip(full, accum):
        torch.testing.assert_close(g_accum, g_full, atol=1e-6, rtol=1e-5)
    assert accum_loss == pytest.approx(full_loss, abs=1e-6)
    assert any(g.abs().sum() > 0 for g in full)


def test_local_normalisation_would_break_invariance() -> None:
    # Guards the test above: normalising each micro-batch by its own token count changes the gradient.
    config = cfg(agg="token-mean")
    full, _ = grads_of(config, micro=8)
    local, _ = grads_of(config, micro=1, global_counts=False)
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(full, local))
