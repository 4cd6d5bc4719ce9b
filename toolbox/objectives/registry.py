"""The losses a config selects, one registry per family, and the protocol each family's entries implement.

This module is the one list of losses: a family is its registry (`LOSS_FAMILIES`), an algorithm's config holds a
spec of it (``algorithm.loss: {name: cispo, clip_high: 0.28}``, built with `Registry.build`), and its learner
builds the loss once and calls it. A loss is one file that registers itself (``gspo.py``: a pydantic options model
that is also the callable loss); the package's ``__init__`` imports every such file, so any import of
``toolbox.objectives`` finds the registries full. A plugin registers into the same registries through the
``toolbox.plugins`` entry point, and its name is then valid in every config of that family.

- policy (`PolicyLoss`): token log-probs of sampled responses and their advantages -> a scalar; GRPO and PPO.
- preference (`PreferenceLoss`): sequence log-probs of chosen and rejected responses -> a loss per pair; DPO.
- supervised (`SupervisedLoss`): logits and target tokens -> a scalar over a global normaliser; SFT.
- value (`ValueLoss`): predicted values, their old values and returns -> a loss per element; PPO's critic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from toolbox.core.registry import Registry, Spec, SpecOf, spec_error


@dataclass
class LossTerms:
    """A scalar loss to backpropagate and the detached numbers that become metrics."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class PolicyInputs:
    """One micro-batch of a policy loss. ``[B, T]`` is rows x response tokens.

    The counts are the whole (global) mini-batch's, this rank's share: a micro-batch normalised by them adds up,
    over micro-batches and ranks, to the loss of one big batch.
    """

    logp_BT: torch.Tensor  # the learner's log-probs of the sampled tokens, with gradient
    old_logp_BT: torch.Tensor  # the policy the importance ratio is taken against (detached)
    adv: torch.Tensor  # [B] (one advantage per sequence) or [B, T]
    mask_BT: torch.Tensor  # the tokens in the loss (the model's own, of rows in the loss)
    token_count: float
    seq_count: float
    norm_length: float  # Dr. GRPO's constant length (the step's padded response width)
    behaviour_logp_BT: torch.Tensor | None = None  # the engine's log-probs when it sampled the tokens
    tis_cap: float = 0.0  # truncated importance sampling cap; 0: off

    @property
    def adv_BT(self) -> torch.Tensor:
        """The advantages broadcast over each row's tokens."""
        return self.adv.unsqueeze(-1).expand_as(self.logp_BT) if self.adv.dim() == 1 else self.adv


class PolicyLoss(Protocol):
    """A policy-gradient loss: `__call__` gives the scalar and its metrics (``pg_loss``, ``clip_frac``, ...);
    `reduce` reduces a per-token penalty the way this loss reduces its own terms (so a KL term shares its weighting)."""

    def __call__(self, x: PolicyInputs) -> LossTerms: ...

    def reduce(self, values_BT: torch.Tensor, x: PolicyInputs) -> torch.Tensor: ...


@dataclass
class PairLogps:
    """Sequence log-probs of the responses of ``B`` preference pairs, the policy's and the frozen reference's."""

    chosen_B: torch.Tensor
    rejected_B: torch.Tensor
    ref_chosen_B: torch.Tensor
    ref_rejected_B: torch.Tensor


class PreferenceLoss(Protocol):
    """A loss per preference pair, ``[B]``; reducing it is the learner's job. `length_average`: whether the
    sequence log-probs it takes are means over the response's tokens rather than sums."""

    @property
    def length_average(self) -> bool: ...

    def __call__(self, pairs: PairLogps, beta: float) -> torch.Tensor: ...


class SupervisedLoss(Protocol):
    """Next-token loss of a micro-batch divided by a global normaliser. `count` is this batch's share of that
    normaliser (target tokens, documents, ...); the learner sums it over micro-batches and ranks."""

    def count(self, mask_BT: torch.Tensor, doc_ids_BT: torch.Tensor) -> float: ...

    def __call__(self, logits_BTV: torch.Tensor, labels_BT: torch.Tensor, mask_BT: torch.Tensor,
                 doc_ids_BT: torch.Tensor, norm: float) -> torch.Tensor: ...


class ValueLoss(Protocol):
    """A critic's loss per element (``[B, T]`` tokens or ``[B]`` env steps); the learner reduces it."""

    def __call__(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor: ...


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
PREFERENCE_LOSSES: Registry[PreferenceLoss] = Registry("preference loss")
SUPERVISED_LOSSES: Registry[SupervisedLoss] = Registry("supervised loss")
VALUE_LOSSES: Registry[ValueLoss] = Registry("value loss")
LOSS_FAMILIES: dict[str, Registry[Any]] = {"policy": POLICY_LOSSES, "preference": PREFERENCE_LOSSES,
                                           "supervised": SUPERVISED_LOSSES, "value": VALUE_LOSSES}


def family_of(name: str) -> str | None:
    """The family a loss name belongs to, or None if no family registers it."""
    return next((fam for fam, registry in LOSS_FAMILIES.items() if name in registry), None)


@dataclass(frozen=True)
class LossOf(SpecOf):
    """A config field holding a loss spec of ``registry``; a name of another family is refused with its family."""

    def parse(self, value: Any) -> Spec:
        name = value.get("name") if isinstance(value, Mapping) else None
        if isinstance(name, str) and name not in self.registry:
            other = family_of(name)
            what = f"is a {other} loss" if other else "is not a registered loss of any family"
            raise spec_error("unregistered", f"{name!r} {what}; this algorithm takes a {self.registry.kind}: "
                             f"{', '.join(self.registry.names())}", ("name",), name)
        return super().parse(value)
