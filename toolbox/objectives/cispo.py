"""CISPO, the ``cispo`` policy loss: REINFORCE weighted by a clipped, detached importance ratio.

MiniMax, 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention" (arXiv:2506.13585),
section 3.1. With ``r_t = pi(y_t) / pi_old(y_t)``::

    J = 1 / sum_i |y_i|  *  sum_i sum_t  sg( clip(r_t, 1 - clip_low, 1 + clip_high) ) * A_i * log pi(y_t)

PPO's clip zeroes the gradient of a token whose ratio left the range (often a rare token the update made likely);
here the weight is clipped instead, so every token keeps a gradient ``w_t * A * grad log pi``. The paper sets no
lower bound (``clip_low`` 1: weights >= 0) and tunes ``clip_high``. Written as ``-w_t * A * pi / sg(pi)``: the same
gradient, and a value (``-w_t A``) on the clipped surrogate's scale, so ``pg_loss`` compares across losses.
``clip_frac`` is the share of tokens whose weight was clipped.
"""

from __future__ import annotations

import torch
from pydantic import Field

from toolbox.objectives.policy import Aggregated, policy_terms
from toolbox.objectives.registry import POLICY_LOSSES, LossTerms, PolicyInputs


class CISPO(Aggregated):
    """CISPO: a clipped, detached importance weight on a REINFORCE term; no token's gradient is dropped."""

    clip_low: float = Field(1.0, ge=0, le=1, description="Lower clip of the weight: w >= 1 - clip_low "
                            "(1: no lower bound, as the paper).")
    clip_high: float = Field(0.28, ge=0, description="Upper clip of the weight: w <= 1 + clip_high.")

    def __call__(self, x: PolicyInputs) -> LossTerms:
        ratio_BT = torch.exp(x.logp_BT - x.old_logp_BT).detach()
        weight_BT = ratio_BT.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        pg_BT = -weight_BT * x.adv_BT * torch.exp(x.logp_BT - x.logp_BT.detach())
        return policy_terms(self, pg_BT, (weight_BT != ratio_BT).to(ratio_BT.dtype), x)


POLICY_LOSSES.register("cispo", config=CISPO)(CISPO)
