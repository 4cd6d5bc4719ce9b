"""Preference losses (DPO family) from sequence log-probabilities, the ``sigmoid``, ``ipo`` and ``hinge``
preference losses. The single source of this math.

Every loss takes summed (or, for IPO, which declares ``length_average``, length-averaged) log-probabilities of whole
responses, ``[B]`` per pair, and returns per-pair values ``[B]``; reducing them to a scalar is the caller's job (so a
micro-batch can be normalised by the global number of pairs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolbox.objectives.registry import PREFERENCE_LOSSES, PairLogps


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


class _SumLogps(BaseModel):
    """A preference loss on summed sequence log-probs."""

    model_config = ConfigDict(extra="forbid")

    @property
    def length_average(self) -> bool:
        return False


class Sigmoid(_SumLogps):
    """DPO (Rafailov et al., 2023): ``-(1 - eps) log sigma(beta h) - eps log sigma(-beta h)``, ``eps`` the
    label smoothing (conservative DPO: a label is wrong with probability ``eps``)."""

    label_smoothing: float = Field(0.0, ge=0, description="Conservative DPO: probability a label is flipped; must "
                                   "lie in [0, 0.5].")

    @field_validator("label_smoothing")
    @classmethod
    def _at_most_half(cls, value: float) -> float:
        if value > 0.5:
            raise ValueError(f"label_smoothing must lie in [0, 0.5], got {value}")
        return value

    def __call__(self, pairs: PairLogps, beta: float) -> torch.Tensor:
        h, eps = _logits(pairs), self.label_smoothing
        return -(1.0 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)


class IPO(BaseModel):
    """IPO (Azar et al., 2023): ``(h - 1 / (2 beta))^2`` on length-averaged log-probs, as its authors use it."""

    model_config = ConfigDict(extra="forbid")

    @property
    def length_average(self) -> bool:
        return True

    def __call__(self, pairs: PairLogps, beta: float) -> torch.Tensor:
        return (_logits(pairs) - 1.0 / (2.0 * beta)).square()


class Hinge(_SumLogps):
    """SLiC (Zhao et al., 2023): ``max(0, 1 - beta h)``."""

    def __call__(self, pairs: PairLogps, beta: float) -> torch.Tensor:
        return torch.relu(1.0 - beta * _logits(pairs))


def _logits(p: PairLogps) -> torch.Tensor:
    return preference_logits(p.chosen_B, p.rejected_B, p.ref_chosen_B, p.ref_rejected_B)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Per-pair losses ``[B]`` of the preference loss ``loss_type`` (a `PREFERENCE_LOSSES` name; ``label_smoothing``
    is ``sigmoid``'s option), with ``h = preference_logits(...)``:

    - ``sigmoid`` (DPO): ``-(1 - eps) * log sigma(beta h) - eps * log sigma(-beta h)``; ``eps`` is
      ``label_smoothing`` (conservative DPO: the label is wrong with probability ``eps``).
    - ``ipo``: ``(h - 1 / (2 beta))^2`` (IPO; use length-averaged log-probs, as its authors do).
    - ``hinge``: ``max(0, 1 - beta h)`` (SLiC).
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    spec = {"name": loss_type, **({"label_smoothing": label_smoothing} if label_smoothing else {})}
    loss = PREFERENCE_LOSSES.build(spec)
    return loss(PairLogps(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps), beta)


PREFERENCE_LOSSES.register("sigmoid", config=Sigmoid)(Sigmoid)
PREFERENCE_LOSSES.register("ipo", config=IPO)(IPO)
PREFERENCE_LOSSES.register("hinge", config=Hinge)(Hinge)
