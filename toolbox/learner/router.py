"""`RouterLoss`: the mixture-of-experts router load-balancing loss, added to every learner's loss the same way.

A MoE decoder (transformers' Qwen2MoE, Mixtral, Qwen3MoE, ...) returns its routers' logits when called with
``output_router_logits=True``; the load-balancing loss of Switch Transformer (Fedus et al., 2021, eq. 4-6) over
them keeps the experts evenly used. Learners differ in their forwards (SFT's packed rows, DPO's pair rows, a reward
model's score head, the RL learners' padded or packed rollout rows), so the loss is taken where they all meet: forward
hooks on the *decoder* module (the one every head calls) ask it for the router logits and score them with the
architecture's own ``load_balancing_loss_func`` and the forward's 2-D attention mask (padding left out). A reward
model's sequence-classification head drops the router logits from its output; the decoder's hook still sees them.

Only forwards that build a graph count (``torch.is_grad_enabled()``): the no-grad passes of a step (old and
reference log-probs, a LoRA reference that is the same module with its adapters off, held-out evaluation) neither
compute nor add it. A learner calls `RouterLoss.add` after each micro-batch's forward to put ``coef x`` its share of
the router loss into what it back-propagates, and `RouterLoss.metrics` once per update (``moe_aux_loss``: the mean
router loss per forward over every rank).

Not covered: a 4-D attention mask (shared prompts of packed rollout rows), whose padding the loss cannot tell from
tokens; `toolbox.learner.packed.RowForwards` keeps each row's own prompt when the router loss is on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from toolbox.learner.collective import global_sum

COEF_FIELD = "algorithm.moe_aux_loss_coef"


class RouterLoss:
    """The router loss of one learner rank's trained model; inert (no hooks, nothing added) when ``coef`` is 0."""

    def __init__(self, model: nn.Module, coef: float) -> None:
        self.coef = coef
        self._pending: list[torch.Tensor] = []  # router losses of the forwards since the last `add`
        self._sum = self._forwards = 0.0
        if coef:
            decoder = moe_decoder(model, coef)
            self._score = _balancing_loss(decoder)
            decoder.register_forward_pre_hook(self._ask_logits, with_kwargs=True)
            decoder.register_forward_hook(self._take_logits, with_kwargs=True)

    @property
    def on(self) -> bool:
        return bool(self.coef)

    def add(self, loss: torch.Tensor, share: float = 1.0) -> torch.Tensor:
        """``loss + coef x share x`` the mean router loss of the forwards since the last call (``loss`` itself when
        off). ``share``: this micro-batch's part of the optimizer step, as the learner normalises its own loss (1 /
        micro-batches per step), so that the step adds ``coef x`` the mean router loss of its forwards."""
        pending, self._pending = self._pending, []
        if not self.coef or not pending:
            return loss
        aux = torch.stack(pending).mean()
        return loss + (self.coef * share) * aux.to(loss.device)

    def metrics(self) -> dict[str, float]:
        """``moe_aux_loss``: the mean router loss per training forward, over every rank, since the last call ({} when
        off, or when no forward built a graph: a held-out evaluation). Collective: every rank calls it."""
        if not self.coef:
            return {}
        total, forwards = global_sum([self._sum, self._forwards])
        self._sum = self._forwards = 0.0
        return {"moe_aux_loss": total / forwards} if forwards else {}

    def _ask_logits(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        if torch.is_grad_enabled():
            kwargs["output_router_logits"] = True
        return args, kwargs

    def _take_logits(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
        if not torch.is_grad_enabled():
            return
        logits = getattr(out, "router_logits", None)
        if not logits:
            raise RuntimeError(f"{COEF_FIELD}: {type(module).__name__} returned no router_logits although asked for "
                               "them (output_router_logits=True)")
        mask = kwargs.get("attention_mask")
        aux = self._score(tuple(logits), mask if mask is not None and mask.dim() == 2 else None)
        self._pending.append(aux)
        self._sum += float(aux.detach())
        self._forwards += 1


def moe_decoder(model: nn.Module, coef: float = 0.0) -> nn.Module:
    """The decoder module of ``model`` (through any head, LoRA or parallel wrapper) whose config says it returns
    router logits; a clear error naming ``algorithm.moe_aux_loss_coef`` for a dense model."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel) and module.base_model is module:
            if hasattr(module.config, "output_router_logits"):
                return module
            break
    raise ValueError(f"{COEF_FIELD}={coef}: {type(_unwrap(model)).__name__} is not a mixture-of-experts model (its "
                     "config has no output_router_logits, so there is no router loss); set it to 0")


def _balancing_loss(decoder: nn.Module) -> Callable[[tuple[torch.Tensor, ...], torch.Tensor | None], torch.Tensor]:
    """The architecture's own ``load_balancing_loss_func`` (in its modeling module) bound to its expert counts."""
    config = decoder.config
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    for cls in type(decoder).__mro__:  # through the classes a parallel wrapper (FSDP2) puts in front
        fn = getattr(sys.modules.get(cls.__module__), "load_balancing_loss_func", None)
        if fn is not None and experts and top_k:
            return lambda logits, mask: fn(logits, experts, top_k, mask)
    raise ValueError(f"{COEF_FIELD}: {type(decoder).__name__}'s modeling module has no load_balancing_loss_func (or "
                     "its config no num_experts / num_experts_per_tok); this architecture's router loss is not "
                     "supported, set it to 0")


def _unwrap(model: nn.Module) -> nn.Module:
    """The innermost ``module`` of a DDP or LoRA wrapper, for naming the model in errors."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model
