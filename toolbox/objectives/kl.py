"""Per-token KL estimators between the policy and a reference (Schulman's k1/k2/k3)."""

from __future__ import annotations

from typing import Literal

import torch

KLKind = Literal["k1", "k2", "k3"]


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from log-probs of the sampled tokens.

    - ``k1``: ``logp - ref_logp`` (unbiased, high variance, can be negative)
    - ``k2``: ``0.5 * (logp - ref_logp)^2``
    - ``k3``: ``exp(ref_logp - logp) - (ref_logp - logp) - 1`` (unbiased, always >= 0)
    """
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        # Clamp keeps exp() finite when the policy has drifted far on a rare token.
        neg = (-log_ratio).clamp(max=20.0)
        return torch.exp(neg) - neg - 1.0
    raise ValueError(f"kl kind must be one of 'k1', 'k2', 'k3', got {kind!r}")
