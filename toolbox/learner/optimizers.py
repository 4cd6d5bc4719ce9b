"""The optimizers ``learner.optim.name`` selects: AdamW (the default), SGD with momentum, Adafactor, and 8-bit AdamW.

Each entry is a factory ``(param_groups, optim config) -> torch.optim.Optimizer``; a plugin adds one with
``@OPTIMIZERS.register("name")`` from a ``toolbox.plugins`` entry point. The parameter groups come from
`param_groups`: with weight decay, parameters of fewer than two dimensions (biases, norm weights, scalar gates)
get none, as in GPT-2, nanoGPT and transformers' Trainer (``learner.optim.decay_norms_and_biases`` turns that off).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from toolbox.core.errors import ConfigError
from toolbox.core.registry import Registry

if TYPE_CHECKING:
    from toolbox.learner.config import OptimConfig

Groups = list[dict[str, Any]]
Opt = TypeVar("Opt", bound=torch.optim.Optimizer)
OPTIMIZERS: Registry[torch.optim.Optimizer] = Registry("optimizer")
NEEDS: dict[str, tuple[str, str]] = {"adamw_8bit": ("bitsandbytes", "pip install bitsandbytes (CUDA builds)")}
# Optimizers whose step cannot run on FSDP2's sharded parameters (DTensor), and why.
NOT_SHARDED: dict[str, str] = {
    "adafactor": "its factored second moments are row and column means of whole matrices, kept as plain tensors "
                 "beside FSDP2's sharded ones (the step fails: 'got mixed torch.Tensor and DTensor')",
    "adamw_8bit": "bitsandbytes' kernels take plain tensors and allocate state like the parameter, not FSDP2's "
                  "DTensor shards (reported upstream as illegal memory accesses)"}


def param_groups(model: nn.Module, o: OptimConfig) -> Groups:
    """The trained parameters (LoRA: the adapters only) as optimizer groups: one, or with weight decay a decayed
    group and a group of parameters under two dimensions without decay (unless ``o.decay_norms_and_biases``)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not o.weight_decay or o.decay_norms_and_biases:
        return [{"params": trainable, "weight_decay": o.weight_decay}]
    groups = [{"params": [p for p in trainable if p.ndim >= 2], "weight_decay": o.weight_decay},
              {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build(model: nn.Module, o: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer ``o.name`` selects over ``model``'s trained parameters."""
    check_available(o.name, "learner.optim.name")
    return OPTIMIZERS.get(o.name).factory(param_groups(model, o), o)


def check_available(name: str, field: str) -> None:
    """A `ConfigError` naming ``field`` when optimizer ``name`` is not registered or its package is missing."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"{field}: {name!r} is not a registered optimizer; allowed: {OPTIMIZERS.names()}")
    module, how = NEEDS.get(name, ("", ""))
    if module and importlib.util.find_spec(module) is None:
        raise ConfigError(f"{field}: {name!r} needs the {module} package, which is not installed ({how}); "
                          "or use adamw")


def check_strategy(name: str, strategy: str, field: str) -> None:
    """A `ConfigError` naming ``field`` when optimizer ``name`` cannot step ``strategy``'s parameters."""
    why = NOT_SHARDED.get(name)
    if strategy == "fsdp2" and why:
        raise ConfigError(f"{field}: {name!r} cannot run with learner.strategy fsdp2: {why}; use learner.strategy "
                          "ddp (or single), or another optimizer (adamw, sgd)")


# torch wraps an optimizer's add_param_group, step, zero_grad, state_dict and load_state_dict so that torch.compile
# leaves them uncompiled, and each wrapper imports torch._dynamo on its first call: 1.2-1.5 CPU s of a learner rank's
# start on the project's 2-core VM, for a compiler toolbox does not run. `eager` calls the methods under the wrappers
# instead (the step with the grad mode its wrapper sets); once torch._dynamo is imported anyway (a user's compiled
# code), torch's wrappers run as they are.
_DYNAMO_WRAPPED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _unwrapped(method: Any, step: bool = False) -> Any:
    raw = inspect.unwrap(method)

    @functools.wraps(raw)
    def call(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" in sys.modules:
            return method(self, *args, **kwargs)
        if not step:
            return raw(self, *args, **kwargs)
        with torch.set_grad_enabled(self.defaults["differentiable"]):  # as torch's `_use_grad_for_differentiable`
            return raw(self, *args, **kwargs)

    return call


_EAGER: dict[type, type] = {}


def eager(cls: type[Opt]) -> type[Opt]:
    """``cls`` (one of torch's optimizers whose step is wrapped by ``_use_grad_for_differentiable``) without the
    wrappers that import torch._dynamo (see above); the same class to ``isinstance`` and to a checkpoint."""
    if cls not in _EAGER:
        methods = {name: _unwrapped(getattr(cls, name)) for name in _DYNAMO_WRAPPED}
        _EAGER[cls] = type(cls.__name__, (cls,), {**methods, "step": _unwrapped(cls.step, step=True),
                                                  "__module__": cls.__module__, "__doc__": cls.__doc__})
    return _EAGER[cls]


def _flat(groups: Groups) -> list[torch.Tensor]:
    return [p for g in groups for p in g["params"]]


@OPTIMIZERS.register("adamw")
def adamw(groups: Groups, o: OptimConfig) -> torch.optim.Optimizer:
    """torch's AdamW, fused where torch fuses these parameters (``learner.optim.kernel``)."""
    from toolbox.learner.optim import adamw_kernel

    return eager(torch.optim.AdamW)(groups, lr=o.lr, betas=o.betas, eps=o.eps, **adamw_kernel(o.kernel, _flat(groups)))


@OPTIMIZERS.register("sgd")
def sgd(groups: Groups, o: OptimConfig) -> torch.optim.Optimizer:
    """torch's SGD with ``learner.optim.momentum`` (Nesterov with ``nesterov``)."""
    return eager(torch.optim.SGD)(groups, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov and o.momentum > 0)


@OPTIMIZERS.register("adafactor")
def adafactor(groups: Groups, o: OptimConfig) -> torch.optim.Optimizer:
    """transformers' Adafactor (factored second moments) at the schedule's learning rate.

    Its second moments keep a row and a column per matrix; its own relative step size is off."""
    from transformers.optimization import Adafactor

    return Adafactor(groups, lr=o.lr, scale_parameter=False, relative_step=False, warmup_init=False)


@OPTIMIZERS.register("adamw_8bit")
def adamw_8bit(groups: Groups, o: OptimConfig) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW with 8-bit block-wise quantised moments (a quarter of AdamW's state memory)."""
    import bitsandbytes as bnb

    return bnb.optim.AdamW8bit(groups, lr=o.lr, betas=o.betas, eps=o.eps)
