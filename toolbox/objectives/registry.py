"""The objective registry: every loss a config names, by family.

Entries are the public math functions themselves (no wrappers), so the catalog, the
configs and users calling ``OBJECTIVES.get("dpo").factory(...)`` all reach the one
implementation. `toolbox.objectives.families` says which trainer takes which family.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolbox.core.registry import Registry
from toolbox.objectives.grpo import grpo_loss
from toolbox.objectives.kl import kl_penalty
from toolbox.objectives.policy import clipped_policy_loss
from toolbox.objectives.preference import dpo_loss
from toolbox.objectives.supervised import document_mean_nll, masked_nll
from toolbox.objectives.value import clipped_value_terms

OBJECTIVES: Registry = Registry("objective")

_ENTRIES: dict[str, Callable[..., Any]] = {
    "sft": masked_nll,  # supervised: token-mean NLL
    "seq": document_mean_nll,  # supervised: per-sequence mean NLL
    "dpo": dpo_loss,  # preference: sigmoid / ipo / hinge via loss_type
    "grpo": grpo_loss,  # policy: clipped surrogate + KL, the GRPO family's configuration
    "ppo_clip": clipped_policy_loss,  # policy: token-level clipped surrogate
    "value_mse": clipped_value_terms,  # value: clipped squared error
    "kl": kl_penalty,  # per-token KL estimators k1/k2/k3
}
for _name, _fn in _ENTRIES.items():
    OBJECTIVES.register(_name)(_fn)
