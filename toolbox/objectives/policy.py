"""Policy-gradient losses: PPO-style clipping at the token level, and truncated importance sampling (TIS) for
tokens another policy sampled."""

from __future__ import annotations

import math

import torch

from toolbox.objectives.aggregate import Aggregation, aggregate
from toolbox.objectives.kl import kl_penalty


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: Aggregation = "token-mean",
    **agg_kwargs: float | None,
) -> torch.Tensor:
    """PPO clipped surrogate, ``-min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)``, aggregated.

    ``logp``/``old_logp``/``mask`` are ``[B, T]``; ``advantages`` is ``[B, T]`` or
    ``[B]`` (one advantage per sequence, broadcast over its tokens). Separate low and
    high clip ranges give DAPO's clip-higher.
    """
    loss_BT, _ = clipped_policy_terms(logp, old_logp, advantages, clip_low, clip_high)
    return aggregate(loss_BT, mask, agg, **agg_kwargs)


def clipped_policy_terms(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped loss and a 0/1 tensor of where the clip was active."""
    adv_BT = adv.unsqueeze(-1).expand_as(logp_BT) if adv.dim() == 1 else adv
    ratio_BT = torch.exp(logp_BT - old_logp_BT)
    unclipped = ratio_BT * adv_BT
    clipped = ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high) * adv_BT
    loss_BT = -torch.minimum(unclipped, clipped)
    return loss_BT, (clipped < unclipped).to(logp_BT.dtype)


def truncated_importance_weights(old_logp_BT: torch.Tensor, behaviour_logp_BT: torch.Tensor,
                                 cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling (TIS): per token ``min(pi_old / pi_behaviour, cap)``, detached, and a 0/1
    tensor of where the cap was active.

    ``pi_behaviour`` is the policy that sampled the token (the engine's log-prob, an older policy version when the
    batch was generated ahead: ``rollout.max_staleness``); ``pi_old`` is the learner's policy the clipped surrogate's
    ratio is taken against. Weighting each token's surrogate by this ratio corrects the gradient for sampling from
    ``pi_behaviour``; truncating it from above bounds its variance (Yao et al., 2025, "Your efficient RL framework
    secretly brings you off-policy RL training"). Computed in log space, so the weight stays finite.
    """
    log_ratio_BT = (old_logp_BT - behaviour_logp_BT).detach()
    log_cap = math.log(cap)
    return torch.exp(log_ratio_BT.clamp(max=log_cap)), (log_ratio_BT > log_cap).to(old_logp_BT.dtype)


def off_policy_correction(pg_BT: torch.Tensor, old_logp_BT: torch.Tensor, behaviour_logp_BT: torch.Tensor | None,
                          cap: float, mask_BT: torch.Tensor,
                          token_count: float) -> tuple[torch.Tensor, dict[str, float]]:
    """``pg_BT`` weighted by `truncated_importance_weights` (unchanged with ``cap`` 0 or no behaviour log-probs), and
    two token means over ``mask_BT`` normalised by ``token_count`` (so micro-batches add up, as ``clip_frac`` does):
    ``tis_frac``, the share of tokens whose weight was capped, and ``behaviour_kl``, the k3 estimate of
    KL(pi_behaviour || pi_old) from the tokens pi_behaviour sampled (never negative; about 0 on policy, it grows with
    the batch's staleness)."""
    if behaviour_logp_BT is None:
        return pg_BT, {}
    gap_BT = kl_penalty(behaviour_logp_BT.detach(), old_logp_BT.detach(), "k3")
    metrics = {"behaviour_kl": float(aggregate(gap_BT, mask_BT, "token-mean", token_count=token_count)), "tis_frac": 0.0}
    if cap <= 0:
        return pg_BT, metrics
    weights_BT, capped_BT = truncated_importance_weights(old_logp_BT, behaviour_logp_BT, cap)
    metrics["tis_frac"] = float(aggregate(capped_BT, mask_BT, "token-mean", token_count=token_count))
    return pg_BT * weights_BT, metrics
