"""Preference losses (DPO family) from sequence log-probabilities. The single source of this math.

Every function takes summed (or, for IPO, length-averaged: the caller's choice)
log-probabilities of whole responses, ``[B]`` per pair, and returns per-pair values
``[B]``; reducing them to a scalar is the caller's job (so a micro-batch can be
normalised by the global number of pairs).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

PreferenceLoss = Literal["sigmoid", "ipo", "hinge"]
PREFERENCE_LOSSES: tuple[str, ...] = ("sigmoid", "ipo", "hinge")


def preference_logits(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
) -> torch.Tensor:
    """``(pi_c - pi_r) - (ref_c - ref_r)``: how much more the policy prefers chosen than the reference does."""
    return (policy_chosen_logps - policy_rejected_logps) - (ref_chosen_logps - ref_rejected_logps)


def implicit_rewards(policy_logps: torch.Tensor, ref_logps: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO's implicit reward of a response, ``beta * (log pi - log ref)``."""
    return beta * (policy_logps - ref_logps)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: PreferenceLoss = "sigmoid",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Per-pair preference losses ``[B]``; with ``h = preference_logits(...)``:

    - ``sigmoid`` (DPO): ``-(1 - eps) * log sigma(beta h) - eps * log sigma(-beta h)``; ``eps`` is
      ``label_smoothing`` (conservative DPO: the label is wrong with probability ``eps``).
    - ``ipo``: ``(h - 1 / (2 beta))^2`` (IPO; use length-averaged log-probs, as its authors do).
    - ``hinge``: ``max(0, 1 - beta h)`` (SLiC).

    ``label_smoothing`` applies to ``sigmoid`` only; it must lie in ``[0, 0.5]``.
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing must lie in [0, 0.5], got {label_smoothing}")
    if label_smoothing and loss_type != "sigmoid":
        raise ValueError(f"label_smoothing applies to loss_type 'sigmoid' only, not {loss_type!r}")
    h = preference_logits(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    if loss_type == "sigmoid":
        return -(1.0 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    if loss_type == "ipo":
        return (h - 1.0 / (2.0 * beta)).square()
    if loss_type == "hinge":
        return torch.relu(1.0 - beta * h)
    raise ValueError(f"loss_type must be one of {PREFERENCE_LOSSES}, got {loss_type!r}")
