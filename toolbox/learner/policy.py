"""`PolicyRank`: the policy side of one learner rank, which every algorithm's learner holds (has-a, not is-a).

It owns the trained policy (wrapped by the parallel strategy) with its optimizer and
schedule, its mixture-of-experts router loss (`RouterLoss`, inert for a dense model), an
optional frozen reference, further trained models a learner attaches (PPO's critic), the
step counter, checkpoints and weight export. The loss and the update belong
to the learner. Every public method is collective: all ranks call it together.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from toolbox.core.storage import RemoteDir, is_remote, join
from toolbox.learner.collective import rank
from toolbox.learner.config import LearnerConfig, OptimConfig
from toolbox.learner.hf_export import export_state
from toolbox.learner.lora import AdapterDisabled, add_adapters, export_lora, sync_buckets
from toolbox.learner.optim import TrainedModel
from toolbox.learner.router import RouterLoss
from toolbox.learner.strategy import Placement, full_state_dict, wrap
from toolbox.models.loading import load_causal_lm
from toolbox.rl.weights import WeightBucket, pack_state_dict


class PolicyRank:
    """One rank's policy: model + optimizer + schedule, optional reference, companions, checkpoints, export."""

    def __init__(self, model: nn.Module, cfg: LearnerConfig, optimizer_steps: int,
                 reference: nn.Module | None = None, router_loss_coef: float = 0.0) -> None:
        self.cfg = cfg
        self.trained = TrainedModel(model, cfg.optim, optimizer_steps, cfg.max_bad_steps, "policy")
        self.router = RouterLoss(model, router_loss_coef)
        self.ref = reference
        self.companions: dict[str, TrainedModel] = {}
        self.step = 0
        # Where the policy came from (set by `pretrained`): the base of a Hugging Face export.
        self.source, self.source_dtype = "", "float32"
        self.loader: Callable[[str, str], nn.Module] = load_causal_lm

    @classmethod
    def pretrained(cls, model_path: str, dtype: str, cfg: LearnerConfig, optimizer_steps: int,
                   frozen_reference: bool = False,
                   loader: Callable[[str, str], nn.Module] = load_causal_lm,
                   router_loss_coef: float = 0.0) -> PolicyRank:
        """A causal LM loaded with ``from_pretrained`` (or by ``loader``) and wrapped by ``cfg.strategy``; with
        ``frozen_reference``, a second, frozen copy of the initial weights wrapped the same way. With ``cfg.lora``
        the model gets LoRA adapters first (only they train) and the reference is the same model with its
        adapters switched off (`toolbox.learner.lora`). ``router_loss_coef``: the weight of a mixture-of-experts
        model's router loss (`RouterLoss`; 0 off, and an error for a dense model)."""
        placement = Placement.of(cfg)  # device, mixed precision, activation checkpointing, offload
        build = trained_loader(model_path, cfg, loader)
        base = build(model_path, dtype).train()  # ``loader``: another head (a reward model's) on the same base
        model = wrap(base if cfg.lora is None else add_adapters(base, cfg.lora), cfg.strategy, placement)
        ref: nn.Module | None = None
        if frozen_reference and cfg.lora is not None:
            ref = AdapterDisabled(model)  # LoRA: the reference is the base model itself, no second copy
        elif frozen_reference:
            ref = wrap(build(model_path, dtype).eval().requires_grad_(False), cfg.strategy, placement, frozen=True)
        policy = cls(model, cfg, optimizer_steps, ref, router_loss_coef)
        policy.source, policy.source_dtype, policy.loader = model_path, dtype, loader
        return policy

    @property
    def model(self) -> nn.Module:
        """The trained policy module (as wrapped by the strategy)."""
        return self.trained.module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.trained.optimizer

    def optimizer_step(self) -> dict[str, float]:
        """The clipped optimizer step of the policy (skipped when its gradient norm is not finite); returns
        ``grad_norm``, ``lr``, ``skipped`` and ``bad_steps``."""
        return self.trained.step()

    def attach(self, name: str, module: nn.Module, optim: OptimConfig, optimizer_steps: int) -> TrainedModel:
        """A second trained model of this rank (a critic): its own optimizer and schedule, checkpointed beside
        the policy in the sub-directory ``name``."""
        if name in self.companions:
            raise ValueError(f"a trained model named {name!r} is already attached to this learner rank")
        self.companions[name] = TrainedModel(module, optim, optimizer_steps, self.cfg.max_bad_steps, name)
        return self.companions[name]

    # ---- weights and checkpoints ------------------------------------------------------------
    def export_weights(self) -> list[WeightBucket]:
        """Full policy weights as buckets on rank 0; ``[]`` on other ranks."""
        state = full_state_dict(self.model)
        if rank() != 0:
            return []
        if self.cfg.lora is not None:  # merged weights under the base model's names, or the adapter alone
            return sync_buckets(state, self.cfg.lora, self.cfg.bucket_mb << 20)
        return pack_state_dict(state, self.cfg.bucket_mb << 20)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded policy weights (on rank 0; empty elsewhere under a process group)."""
        return full_state_dict(self.model)

    def export_hf(self, path: str | Path) -> str:
        """The policy as a Hugging Face model directory at ``path`` (a directory or a URL: written locally, then
        uploaded), written by rank 0 (the others join the gather)."""
        if not self.source:
            raise RuntimeError("export_hf: this policy was not loaded with PolicyRank.pretrained, so there is no base "
                               "model to take its config and tokenizer from")
        state = self.full_state_dict()
        if rank() != 0:
            return str(path)
        if not is_remote(str(path)):
            self._export_to(state, path)
            return str(path)
        with tempfile.TemporaryDirectory(prefix="toolbox-export-") as local:
            self._export_to(state, local)
            RemoteDir(str(path)).put_tree(Path(local), "")
        return str(path)

    def _export_to(self, state: dict[str, torch.Tensor], path: str | Path) -> None:
        if self.cfg.lora is not None:
            export_lora(state, self.source, self.source_dtype, self.cfg.lora, path)
        else:
            export_state(state, self.source, self.source_dtype, path, self.loader)

    def save(self, path: str | Path) -> str:
        """The policy (with step and schedule) into ``path`` (a directory or a URL), each attached model into
        ``path/name``."""
        self.trained.save(str(path), {"step": self.step})
        for name, companion in self.companions.items():
            companion.save(join(path, name), {})
        return str(path)

    def load(self, path: str | Path) -> int:
        """Restore what `save` wrote; returns the step it was saved at."""
        self.step = int(self.trained.load(str(path))["step"])
        for name, companion in self.companions.items():
            companion.load(join(path, name))
        return self.step


def trained_loader(model_path: str, cfg: LearnerConfig,
                   loader: Callable[[str, str], nn.Module]) -> Callable[[str, str], nn.Module]:
    """What builds the trained modules: toolbox's own Llama-family module where ``learner.forward`` is auto, the
    policy is a causal LM (``loader`` is `load_causal_lm`) without LoRA (peft wraps transformers' modules) and the
    directory is one it covers (`toolbox.models.lean_llama.lean_or`, the engines' rule); ``loader`` otherwise. An
    export still writes through ``loader`` (transformers' ``save_pretrained``): the names are the same."""
    from toolbox.models.lean_llama import lean_or, lean_unsupported

    if cfg.forward == "auto" and loader is load_causal_lm and cfg.lora is None and lean_unsupported(model_path) is None:
        return lean_or(loader)
    return loader

