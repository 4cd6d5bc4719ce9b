"""Policy-gradient losses: PPO-style clipping at the token level (the ``ppo_clip`` policy loss, GRPO's and PPO's
default), truncated importance sampling (TIS) for tokens another policy sampled, and the pieces every policy loss
shares (`Aggregated`, `policy_terms`, `policy_objective`)."""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel, ConfigDict, Field

from toolbox.objectives.aggregate import Aggregation, aggregate
from toolbox.objectives.kl import KLKind, kl_penalty
from toolbox.objectives.registry import POLICY_LOSSES, LossTerms, PolicyInputs, PolicyLoss


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
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped loss and a 0/1 tensor of where the clip was active.

    ``dual_clip`` c > 1 (Ye et al., 2020, "Mastering Complex Control in MOBA Games with Deep Reinforcement
    Learning"): where the advantage is negative the loss is at most ``-c * A``, so a token whose ratio has grown
    far beyond 1 cannot push an unbounded step.
    """
    adv_BT = adv.unsqueeze(-1).expand_as(logp_BT) if adv.dim() == 1 else adv
    return clip_surrogate(torch.exp(logp_BT - old_logp_BT), adv_BT, clip_low, clip_high, dual_clip)


def clip_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float,
                   dual_clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``-min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)`` elementwise (capped at ``-dual_clip * A`` where A < 0)
    and a 0/1 tensor of where the clip was active; for a ratio per token or per sequence alike."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    return loss, (clipped < unclipped).to(ratio.dtype)


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


class Aggregated(BaseModel):
    """The option every built-in policy loss has: how its per-token terms (and a KL penalty) reduce to a scalar."""

    model_config = ConfigDict(extra="forbid")
    agg: Aggregation = Field("token-mean", description="How per-token losses reduce to a scalar: token-mean, "
                             "seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm (Dr. GRPO).")

    def reduce(self, values_BT: torch.Tensor, x: PolicyInputs) -> torch.Tensor:
        """``values_BT`` reduced over ``x``'s tokens by ``agg``, normalised by ``x``'s global counts."""
        return aggregate(values_BT, x.mask_BT, self.agg, token_count=x.token_count, seq_count=x.seq_count,
                         norm_length=x.norm_length)


def policy_terms(loss: Aggregated, pg_BT: torch.Tensor, clipped_BT: torch.Tensor, x: PolicyInputs) -> LossTerms:
    """A policy loss's scalar from its per-token terms: weighted by TIS when ``x`` has behaviour log-probs
    (`off_policy_correction`), reduced by ``loss.agg``; metrics ``pg_loss``, ``clip_frac`` (token mean of
    ``clipped_BT``) and the off-policy ones."""
    pg_BT, off_policy = off_policy_correction(pg_BT, x.old_logp_BT, x.behaviour_logp_BT, x.tis_cap, x.mask_BT,
                                              x.token_count)
    pg = loss.reduce(pg_BT, x)
    clip_frac = float(aggregate(clipped_BT, x.mask_BT, "token-mean", token_count=x.token_count))
    return LossTerms(pg, {"pg_loss": float(pg.detach()), "clip_frac": clip_frac, **off_policy})


def policy_objective(loss: PolicyLoss, x: PolicyInputs, ref_logp_BT: torch.Tensor | None, kl_coef: float,
                     kl_kind: KLKind) -> LossTerms:
    """``loss(x)`` plus ``kl_coef`` x the KL to the reference reduced as the loss reduces its terms (when there is a
    reference and a weight); metric ``kl`` (0 without)."""
    terms = loss(x)
    kl_value = 0.0
    if ref_logp_BT is not None and kl_coef > 0:
        kl = loss.reduce(kl_penalty(x.logp_BT, ref_logp_BT, kl_kind), x)
        terms.loss = terms.loss + kl_coef * kl
        kl_value = float(kl.detach())
    terms.metrics["kl"] = kl_value
    return terms


class PPOClip(Aggregated):
    """PPO's clipped surrogate per token; clip-higher when ``clip_high > clip_low`` (DAPO), the dual clip when set.

    ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)`` with ``r = pi / pi_old`` (Schulman et al., 2017,
    "Proximal Policy Optimization Algorithms"): GRPO's and PPO's policy loss.
    """

    clip_low: float = Field(0.2, ge=0, description="Lower clip range: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.2, ge=0, description="Upper clip range: ratio <= 1 + clip_high (DAPO's clip-higher).")
    dual_clip: float | None = Field(None, gt=1, description="Dual-clip PPO: where the advantage is negative, the "
                                    "loss is at most -dual_clip * A. Unset: off.")

    def __call__(self, x: PolicyInputs) -> LossTerms:
        pg_BT, clipped_BT = clipped_policy_terms(x.logp_BT, x.old_logp_BT, x.adv, self.clip_low, self.clip_high,
                                                 self.dual_clip)
        return policy_terms(self, pg_BT, clipped_BT, x)


POLICY_LOSSES.register("ppo_clip", config=PPOClip)(PPOClip)
