"""LoRA adapters through ``peft``: only the adapter weights train; engines and exports get merged weights.

`add_adapters` turns a causal LM into a ``peft`` model before the parallel strategy wraps it (FSDP2 shards the
frozen base weights and the trainable adapters alike; its per-parameter sharding allows both in one group).
`AdapterDisabled` is the frozen reference without a second copy: the same module run inside
``disable_adapter()``. `merged_state_dict` turns the gathered adapter-model state dict into the base model's
names with ``W + (alpha / r) B A`` folded in (the trained module is not touched), which is what weight sync
sends to engines. `export_lora` writes the adapter (``peft`` format) and, optionally, the merged model.

Not covered: DoRA, rsLoRA, ``fan_in_fan_out`` layers (GPT-2's Conv1D) and adapters on embeddings; sending
adapters (not merged weights) to engines that take them (vLLM's LoRA requests).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

PEFT_PREFIX = "base_model.model."  # what a peft model puts before the base model's parameter names
ADAPTER = "default"  # peft's name of the one adapter we add
ADAPTER_DIR = "adapter"  # the export's sub-directory holding the adapter


class LoraConfig(BaseModel):
    """``learner.lora``: LoRA adapters (peft) on the policy; the base weights stay frozen."""

    model_config = ConfigDict(extra="forbid")
    r: int = Field(8, ge=1, description="Rank of each adapter's A (r x in) and B (out x r) matrices.")
    alpha: float = Field(16.0, gt=0, description="Adapter scale numerator: the update is (alpha / r) B A.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input while training.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names (suffixes, e.g. [q_proj, v_proj]) that get adapters, or "
        "'all-linear': every linear layer but the output head.")
    export_merged: bool = Field(True, description="Export also writes the merged model (base + adapter) as a "
                                "plain Hugging Face directory; the adapter itself always goes to `adapter/`.")


def _peft() -> Any:
    try:
        import peft
    except ImportError as err:  # an optional extra: say how to get it
        raise ImportError("learner.lora needs the peft package: pip install 'toolbox[lora]' (or pip install peft)"
                          ) from err
    return peft


def add_adapters(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """``model`` as a peft model with one LoRA adapter per target module; only adapter weights require grad."""
    peft = _peft()
    config = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                             target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, config)
    except ValueError as err:  # e.g. a target module name the model does not have
        raise ValueError(f"learner.lora.target_modules={cfg.target_modules!r}: {err}") from None


class AdapterDisabled(nn.Module):
    """The reference policy of a LoRA run: the trained peft model's forward with its adapters switched off.

    It holds the policy without registering it as a submodule, so it adds no parameters (no second copy) and a
    ``.eval()`` here leaves the policy's mode alone.
    """

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self._policy = [policy]  # a list: not registered as a child module

    @property
    def config(self) -> Any:
        from toolbox.learner.strategy import unwrap

        return unwrap(self._policy[0]).config

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from toolbox.learner.strategy import unwrap

        policy = self._policy[0]
        peft_model: Any = unwrap(policy)  # DDP hides the peft model's methods; FSDP2 keeps them
        switch: AbstractContextManager[Any] = peft_model.disable_adapter()
        with switch:
            return policy(*args, **kwargs)


def merged_state_dict(state: dict[str, torch.Tensor], cfg: LoraConfig) -> dict[str, torch.Tensor]:
    """The base model's state dict, named as the base model names it, with each adapter folded into its weight.

    ``state`` is a peft model's full state dict (``base_model.model.<name>``, ``<module>.base_layer.weight``,
    ``<module>.lora_A.default.weight``, ...). Pure: returns new tensors for merged weights, shares the others.
    """
    scale = cfg.alpha / cfg.r
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = key.removeprefix(PEFT_PREFIX)
        if ".lora_A." in name or ".lora_B." in name:
            continue  # folded into their base layer's weight below
        module, sep, leaf = name.partition(".base_layer.")
        if not sep:
            out[name] = value
            continue
        if leaf == "weight":
            a = state[f"{PEFT_PREFIX}{module}.lora_A.{ADAPTER}.weight"].to(torch.float32)
            b = state[f"{PEFT_PREFIX}{module}.lora_B.{ADAPTER}.weight"].to(torch.float32)
            value = (value.to(torch.float32) + scale * (b @ a)).to(value.dtype)
        out[f"{module}.{leaf}"] = value
    return out


def export_lora(state: dict[str, torch.Tensor], source: str, dtype: str, cfg: LoraConfig, out: str | Path) -> Path:
    """Write a LoRA policy's gathered state: the adapter to ``out/adapter`` (``PeftModel.from_pretrained`` loads
    it onto the base model) and, with ``cfg.export_merged``, the merged model to ``out`` itself."""
    from toolbox.learner.hf_export import base_model, load_full_state

    model = add_adapters(base_model(source, dtype), cfg)
    load_full_state(model, state, "learner state dict (LoRA)")
    return write_lora(model, source, cfg, out)


def write_lora(model: Any, source: str, cfg: LoraConfig, out: str | Path, trust_remote_code: bool = False) -> Path:
    """A trained peft ``model`` (on one process) as ``out/adapter`` and, with ``cfg.export_merged``, the merged
    model in ``out``. Merging goes into ``model`` itself: call it on a copy that is not trained further."""
    from toolbox.learner.hf_export import write_hf_dir

    out = Path(out)
    model.save_pretrained(out / ADAPTER_DIR)
    if cfg.export_merged:
        write_hf_dir(model.merge_and_unload(), source, out, trust_remote_code)
    return out
