"""The GRPO family's loss: clipped surrogate (weighted by truncated importance sampling when the batch was sampled
by another policy) plus a KL to the reference, aggregated over tokens.

Loss math only. The variants differ by arguments (Dr. GRPO: ``agg=seq-mean-token-sum-norm``;
DAPO: ``clip_high > clip_low``); their configs live in `toolbox.algorithms.grpo`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from toolbox.objectives.aggregate import Aggregation, aggregate
from toolbox.objectives.kl import KLKind, kl_penalty
from toolbox.objectives.policy import clipped_policy_terms, off_policy_correction


@dataclass
class GRPOLossTerms:
    """The scalar loss and the detached pieces that become metrics."""

    loss: torch.Tensor
    pg_loss: float
    kl: float
    clip_frac: float
    off_policy: dict[str, float] = field(default_factory=dict)  # behaviour_kl, tis_frac (with behaviour log-probs)


def grpo_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    token_count: float,
    seq_count: float,
    norm_length: float,
    *,
    clip_low: float,
    clip_high: float,
    agg: Aggregation = "token-mean",
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k3",
    behaviour_logp_BT: torch.Tensor | None = None,
    tis_cap: float = 0.0,
) -> GRPOLossTerms:
    """Loss of one micro-batch, normalised by the counts of the whole (global) mini-batch.

    Passing global counts makes micro-batch accumulation and data parallelism give the
    same gradient as one big batch. With ``behaviour_logp_BT`` (the engine's log-probs of the sampled tokens),
    each token's surrogate is weighted by ``min(exp(old - behaviour), tis_cap)`` (`off_policy_correction`; ``tis_cap``
    0: no weight), and ``off_policy`` reports ``behaviour_kl`` and ``tis_frac``.
    """
    norms = {"token_count": token_count, "seq_count": seq_count, "norm_length": norm_length}
    pg_BT, clipped_BT = clipped_policy_terms(logp_BT, old_logp_BT, adv_B, clip_low, clip_high)
    pg_BT, off_policy = off_policy_correction(pg_BT, old_logp_BT, behaviour_logp_BT, tis_cap, mask_BT, token_count)
    pg = aggregate(pg_BT, mask_BT, agg, **norms)
    loss, kl_value = pg, 0.0
    if ref_logp_BT is not None and kl_coef > 0:
        kl = aggregate(kl_penalty(logp_BT, ref_logp_BT, kl_kind), mask_BT, agg, **norms)
        loss = loss + kl_coef * kl
        kl_value = float(kl.detach())
    clip_frac = float(aggregate(clipped_BT, mask_BT, "token-mean", token_count=token_count))
    return GRPOLossTerms(loss, float(pg.detach()), kl_value, clip_frac, off_policy)
