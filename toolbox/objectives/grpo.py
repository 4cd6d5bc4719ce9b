"""The GRPO family's objective: group-relative advantages, clipped surrogate, KL to a reference.

One config covers GRPO and its variants by choice of advantage estimator, clip range
and aggregation (Dr. GRPO: ``advantage=group_mean, agg=seq-mean-token-sum-norm``;
DAPO: ``clip_high > clip_low``, ``dynamic_sampling``, ``overlong_buffer`` /
``overlong_filter``; RLOO: ``advantage=rloo``; REINFORCE++: ``advantage=reinforce_pp``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from toolbox.objectives.aggregate import Aggregation, aggregate
from toolbox.objectives.kl import KLKind, kl_penalty
from toolbox.objectives.policy import clipped_policy_terms
from toolbox.rl.advantages import ADVANTAGES


class GRPOConfig(BaseModel):
    """The algorithm section of a GRPO experiment."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["grpo"] = Field("grpo", description="Algorithm: selects the trainer and recipe.")
    prompts_per_step: int = Field(16, ge=1, description="Distinct prompts sampled per step.")
    group_size: int = Field(8, ge=1, description="Completions sampled per prompt (G).")
    advantage: str = Field("group_norm", description="Advantage estimator: group_norm, group_mean, rloo, reinforce_pp.")
    clip_low: float = Field(0.2, ge=0, description="Lower PPO clip range: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.2, ge=0, description="Upper PPO clip range: ratio <= 1 + clip_high (DAPO's clip-higher).")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the KL-to-reference term in the loss; 0 skips the reference model.")
    kl_kind: KLKind = Field("k3", description="KL estimator: k1, k2 or k3.")
    agg: Aggregation = Field("token-mean", description="How per-token losses reduce to a scalar.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch.")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per epoch (the batch is split into this many).")
    temperature: float = Field(1.0, gt=0, description="Temperature the learner applies to logits (match sampling).")
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups whose rewards are all equal, top the batch up.")
    max_sampling_rounds: int = Field(3, ge=1, description="Rollout rounds per step at most when topping the batch up.")
    overlong_filter: bool = Field(False, description="DAPO: leave responses cut at max_new_tokens out of the loss.")
    overlong_buffer: int = Field(0, ge=0, description="DAPO soft overlong punishment: the last N tokens before the limit.")
    overlong_penalty: float = Field(1.0, ge=0, description="Reward subtracted (linearly over the buffer) at the length limit.")

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


def grpo_advantages(rewards_B: torch.Tensor, group_size: int, estimator: str) -> torch.Tensor:
    """Per-sequence advantages from rewards laid out group by group (``[B*G]`` -> ``[B*G]``)."""
    if rewards_B.numel() % group_size:
        raise ValueError(f"{rewards_B.numel()} rewards do not split into groups of {group_size}")
    fn = ADVANTAGES.get(estimator).factory
    return fn(rewards_B.view(-1, group_size)).reshape(-1)


def overlong_shaping(lengths_B: torch.Tensor, max_len: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment, to be added to rewards: 0 up to ``max_len - buffer``, then
    falling linearly to ``-penalty`` at ``max_len``."""
    if buffer <= 0:
        return torch.zeros(lengths_B.shape, dtype=torch.float32)
    over = (lengths_B.float() - (max_len - buffer)).clamp(min=0.0)
    return -penalty * (over / buffer).clamp(max=1.0)


def informative_groups(values_B: torch.Tensor, ok_B: torch.Tensor, group_B: torch.Tensor) -> dict[int, bool]:
    """Per group id: whether its scored rewards differ (a group of equal rewards has zero advantage)."""
    out: dict[int, bool] = {}
    for g in group_B.unique().tolist():
        rows = (group_B == g) & ok_B
        vals = values_B[rows]
        out[int(g)] = bool(vals.numel() > 1 and (vals.max() - vals.min()) > 1e-9)
    return out


def choose_groups(rounds: list[dict[int, bool]], need: int) -> list[int]:
    """DAPO dynamic sampling: the first ``need`` informative groups over the rounds, in order; if too few,
    filled up with uninformative ones (zero advantage: they keep the batch shape, move nothing)."""
    flags = [(g, ok) for r in rounds for g, ok in sorted(r.items())]
    chosen = [g for g, ok in flags if ok][:need]
    chosen += [g for g, ok in flags if not ok][: need - len(chosen)]
    return sorted(chosen)


@dataclass
class GRPOLossTerms:
    """The scalar loss and the detached pieces that become metrics."""

    loss: torch.Tensor
    pg_loss: float
    kl: float
    clip_frac: float


def grpo_loss(
    cfg: GRPOConfig,
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    token_count: float,
    seq_count: float,
    norm_length: float,
) -> GRPOLossTerms:
    """Loss of one micro-batch, normalised by the counts of the whole (global) mini-batch.

    Passing global counts makes micro-batch accumulation and data parallelism give the
    same gradient as one big batch.
    """
    norms = {"token_count": token_count, "seq_count": seq_count, "norm_length": norm_length}
    pg_BT, clipped_BT = clipped_policy_terms(logp_BT, old_logp_BT, adv_B, cfg.clip_low, cfg.clip_high)
    pg = aggregate(pg_BT, mask_BT, cfg.agg, **norms)
    loss, kl_value = pg, 0.0
    if ref_logp_BT is not None and cfg.kl_coef > 0:
        kl = aggregate(kl_penalty(logp_BT, ref_logp_BT, cfg.kl_kind), mask_BT, cfg.agg, **norms)
        loss = loss + cfg.kl_coef * kl
        kl_value = float(kl.detach())
    clip_frac = float(aggregate(clipped_BT, mask_BT, "token-mean", token_count=token_count))
    return GRPOLossTerms(loss, float(pg.detach()), kl_value, clip_frac)
