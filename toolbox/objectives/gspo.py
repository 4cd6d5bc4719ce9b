"""GSPO, the ``gspo`` policy loss: the importance ratio, its clipping and its weight are per sequence, not per token.

Zheng et al., 2025, "Group Sequence Policy Optimization" (arXiv:2507.18071). For response ``y_i`` of ``|y_i|`` tokens
with advantage ``A_i``::

    s_i = (pi(y_i) / pi_old(y_i)) ^ (1 / |y_i|) = exp( mean_t [log pi(y_i,t) - log pi_old(y_i,t)] )
    J   = mean_i  min( s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i )

The length normalisation keeps ``s_i`` of a long and a short response on one scale, which is why its clip range is
three orders of magnitude narrower than PPO's (the paper's 3e-4 / 4e-4). Computed in the paper's GSPO-token form,
``s_i,t = sg(s_i) * pi(y_i,t) / sg(pi(y_i,t))``: every token of a sequence has the value ``s_i``, and with
``agg: seq-mean-token-mean`` (each sequence once) the gradient is GSPO's; a per-token advantage, a TIS weight or
another aggregation then applies token by token. ``clip_frac`` is the token share of clipped sequences.
"""

from __future__ import annotations

import torch
from pydantic import Field

from toolbox.objectives.aggregate import Aggregation
from toolbox.objectives.policy import Aggregated, clip_surrogate, policy_terms
from toolbox.objectives.registry import POLICY_LOSSES, LossTerms, PolicyInputs


def sequence_log_ratio(logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """``log s_i``, ``[B]``: the mean over each row's ``mask_BT`` tokens of ``logp - old_logp`` (0 for an empty row)."""
    mask = mask_BT.to(logp_BT.dtype)
    return ((logp_BT - old_logp_BT) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class GSPO(Aggregated):
    """GSPO: the clipped surrogate on the length-normalised sequence ratio (Zheng et al., 2025)."""

    agg: Aggregation = Field("seq-mean-token-mean", description="How per-token losses reduce to a scalar; "
                             "seq-mean-token-mean weighs each sequence once, as GSPO does.")
    clip_low: float = Field(3e-4, ge=0, description="Lower clip range of the sequence ratio: s >= 1 - clip_low.")
    clip_high: float = Field(4e-4, ge=0, description="Upper clip range of the sequence ratio: s <= 1 + clip_high.")

    def __call__(self, x: PolicyInputs) -> LossTerms:
        log_s_B = sequence_log_ratio(x.logp_BT, x.old_logp_BT, x.mask_BT)
        ratio_BT = torch.exp(log_s_B.detach().unsqueeze(1) + x.logp_BT - x.logp_BT.detach())
        pg_BT, clipped_BT = clip_surrogate(ratio_BT, x.adv_BT, self.clip_low, self.clip_high)
        return policy_terms(self, pg_BT, clipped_BT, x)


POLICY_LOSSES.register("gspo", config=GSPO)(GSPO)
