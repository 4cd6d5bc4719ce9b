"""The GRPO family's loss: clipped surrogate (weighted by truncated importance sampling when the batch was sampled
by another policy) plus a KL to the reference, aggregated over tokens.

Loss math only. The variants differ by arguments (Dr. GRPO: ``agg=seq-mean-token-sum-norm``;
DAPO: ``clip_high > clip_low``); their configs live in `toolbox.algorithms.grpo`. The learners call the policy loss
their config selects (`toolbox.objectives.registry.POLICY_LOSSES`) through `policy_objective`; this function is that
call for ``ppo_clip`` with its options as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from toolbox.objectives.aggregate import Aggregation
from toolbox.objectives.kl import KLKind
from toolbox.objectives.policy import PPOClip, policy_objective
from toolbox.objectives.registry import PolicyInputs


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
    """Loss of one micro-batch with GRPO's default policy loss (``ppo_clip``), normalised by the counts of the whole
    (global) mini-batch: `policy_objective` with the arguments spelled out.

    Passing global counts makes micro-batch accumulation and data parallelism give the
    same gradient as one big batch. With ``behaviour_logp_BT`` (the engine's log-probs of the sampled tokens),
    each token's surrogate is weighted by ``min(exp(old - behaviour), tis_cap)`` (`off_policy_correction`; ``tis_cap``
    0: no weight), and ``off_policy`` reports ``behaviour_kl`` and ``tis_frac``.
    """
    x = PolicyInputs(logp_BT, old_logp_BT, adv_B, mask_BT, token_count, seq_count, norm_length, behaviour_logp_BT,
                     tis_cap)
    terms = policy_objective(PPOClip(clip_low=clip_low, clip_high=clip_high, agg=agg), x, ref_logp_BT, kl_coef, kl_kind)
    m = dict(terms.metrics)
    return GRPOLossTerms(terms.loss, m.pop("pg_loss"), m.pop("kl"), m.pop("clip_frac"), m)
