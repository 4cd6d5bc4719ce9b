"""LoRA adapters through ``peft``: only the adapter weights train; engines get merged weights or the adapter.

`add_adapters` turns a causal LM into a ``peft`` model before the parallel strategy wraps it (FSDP2 shards the
frozen base weights and the trainable adapters alike; its per-parameter sharding allows both in one group).
`AdapterDisabled` is the frozen reference without a second copy: the same module run inside
``disable_adapter()``. `export_lora` writes the adapter (``peft`` format) and, optionally, the merged model.

Weight sync (`sync_buckets`), as ``learner.lora.sync`` says:

- ``merged``: `merged_state_dict` turns the gathered adapter-model state dict into the base model's names with
  ``W + (alpha / r) B A`` folded in (the trained module is not touched); any engine loads that.
- ``adapter``: `adapter_state_dict` keeps the adapter tensors alone, named as ``peft`` saves them, in buckets
  that carry the LoRA config (`WeightBucket.adapter`). An engine that takes adapters (`check_adapter_sync`
  asks its config) loads them: the ``hf`` engine with `load_adapter` (peft, on its own model), the ``vllm``
  engine as a LoRA request over `write_adapter_dir`'s directory.

Not covered: DoRA, rsLoRA, ``fan_in_fan_out`` layers (GPT-2's Conv1D) and adapters on embeddings.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from toolbox.core.errors import ConfigError
from toolbox.core.extras import needs_extra
from toolbox.rl.weights import WeightBucket, pack_state_dict, unpack_all

if TYPE_CHECKING:
    from toolbox.core.registry import Spec

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
    sync: Literal["merged", "adapter"] = Field(
        "merged", description="What weight sync sends the rollout engines: `merged`, the base model's weights with "
        "the adapters folded in (every engine); `adapter`, the adapter weights alone (a fraction of the bytes), for "
        "engines that take adapters: hf (loads them with peft), vllm (a LoRA request; needs "
        "rollout.engine.engine_kwargs {enable_lora: true, max_lora_rank: >= r}), multi_turn around either.")


def _peft() -> Any:
    try:
        import peft
    except ImportError as err:  # an optional extra: say how to get it
        raise ImportError(needs_extra("learner.lora", "lora", f"peft is not installed: {err}")) from err
    return peft


def add_adapters(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """``model`` as a peft model with one LoRA adapter per target module; only adapter weights require grad."""
    peft = _peft()
    try:
        return peft.get_peft_model(model, peft_config(cfg))
    except ValueError as err:  # e.g. a target module name the model does not have
        raise ValueError(f"learner.lora.target_modules={cfg.target_modules!r}: {err}") from None


def peft_config(cfg: LoraConfig) -> Any:
    """``cfg`` as a ``peft.LoraConfig`` (what `add_adapters` applies and ``adapter_config.json`` holds)."""
    return _peft().LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                              target_modules=cfg.target_modules, task_type="CAUSAL_LM")


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


def adapter_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a peft model's full state dict, named as ``peft`` saves them (and
    ``set_peft_model_state_dict`` / vLLM read them): ``<module>.lora_A.weight``, the adapter name dropped."""
    marker = f".{ADAPTER}."
    return {key.replace(marker, "."): value for key, value in state.items()
            if ".lora_A." in key or ".lora_B." in key}


def sync_buckets(state: dict[str, torch.Tensor], cfg: LoraConfig, bucket_bytes: int) -> list[WeightBucket]:
    """What weight sync sends for a LoRA policy's gathered ``state``: merged weights, or (``cfg.sync: adapter``)
    the adapter alone in buckets that carry ``cfg``."""
    if cfg.sync == "merged":
        return pack_state_dict(merged_state_dict(state, cfg), bucket_bytes)
    buckets = pack_state_dict(adapter_state_dict(state), bucket_bytes)
    for bucket in buckets:
        bucket.adapter = cfg.model_dump()
    return buckets


def adapter_update(buckets: list[WeightBucket]) -> LoraConfig | None:
    """The LoRA config when ``buckets`` hold adapter weights alone (``learner.lora.sync: adapter``), else None."""
    configs = [b.adapter for b in buckets]
    if not any(c is not None for c in configs):
        return None
    if not all(c == configs[0] for c in configs):
        raise ValueError("a weight update mixes adapter buckets with full-weight ones (or two LoRA configs)")
    return LoraConfig.model_validate(configs[0])


def load_adapter(model: nn.Module, buckets: list[WeightBucket], cfg: LoraConfig) -> tuple[nn.Module, int]:
    """An engine's ``model`` with the adapter weights of ``buckets`` loaded (peft's ``set_peft_model_state_dict``).

    The first update gives the plain model its adapters (``cfg``); later ones overwrite them in place. Returns the
    model to generate with and the bytes loaded. Fails loudly on a tensor the model has no slot for, or an
    adapter weight the update leaves out.
    """
    peft = _peft()
    if not isinstance(model, peft.PeftModel):
        model = add_adapters(model, cfg).eval()
    tensors = unpack_all(buckets)
    result = peft.set_peft_model_state_dict(model, tensors)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or missing:
        raise KeyError(f"adapter weight update does not fit the engine's adapters: unexpected "
                       f"{sorted(result.unexpected_keys)[:3]}, missing {sorted(missing)[:3]} (learner.lora is "
                       f"{cfg.model_dump()})")
    return model, sum(t.numel() * t.element_size() for t in tensors.values())


def write_adapter_dir(buckets: list[WeightBucket], cfg: LoraConfig, path: str | Path) -> Path:
    """The adapter of ``buckets`` as a ``peft`` adapter directory (``adapter_config.json`` +
    ``adapter_model.safetensors``): what ``PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` load."""
    from safetensors.torch import save_file

    path = Path(path)
    peft_config(cfg).save_pretrained(str(path))
    save_file({k: v.contiguous() for k, v in unpack_all(buckets).items()}, str(path / "adapter_model.safetensors"))
    return path


def check_adapter_sync(cfg: LoraConfig | None, engine: Spec, field: str = "rollout.engine") -> None:
    """`ConfigError` when ``learner.lora.sync: adapter`` goes to an engine that cannot take adapters.

    An engine takes adapters when its config has ``check_adapters(lora)`` (which may refuse its own options).
    """
    if cfg is None or cfg.sync != "adapter":
        return
    check = getattr(engine, "check_adapters", None)
    if check is None:
        raise ConfigError(f"learner.lora.sync: adapter: {field} {engine.name!r} does not take LoRA adapters "
                          "(hf and vllm do, and multi_turn around them); use learner.lora.sync: merged")
    check(cfg)


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
