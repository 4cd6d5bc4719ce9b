"""The shape of the policy model that memory estimates need, read from its config alone: the config (``AutoConfig``, or
the tiny model's) instantiated on the ``meta`` device, which allocates no storage, for the parameter count (LoRA:
the adapters' too). A hub id's ``config.json`` is fetched (a few KB) when it is not cached; the weights never are."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolbox.config.schema import ExperimentConfig


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs to know of the policy model."""

    params: int
    block_params: int  # one decoder block: what FSDP2 gathers unsharded at a time
    output_params: int  # the LM head (a critic replaces it by a value head)
    layers: int
    hidden: int
    heads: int
    vocab: int
    max_positions: int
    source: str
    kv_heads: int = 0  # key/value heads (grouped-query attention); 0: as many as heads
    head_dim: int = 0  # 0: hidden / heads
    intermediate: int = 0  # the MLP's width (gate and up projections); 0: 4 x hidden
    attention: str = "sdpa"  # the attention implementation: eager keeps the score matrices for backward
    lora_params: int = 0  # with learner.lora: the adapters' parameters (what trains)

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder blocks (embeddings, final norm, LM head): FSDP2's root group."""
        return self.params - self.layers * self.block_params

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * (self.head_dim or self.hidden // self.heads)


def model_shape(cfg: ExperimentConfig) -> ModelShape:
    """The policy's sizes from its config alone: the tiny model's, or ``AutoConfig.from_pretrained(model.path)``."""
    import torch
    from transformers import AutoModelForCausalLM

    path = cfg.model.path
    if cfg.model.tiny is not None and not (path and (Path(path) / "config.json").is_file()):
        from toolbox.data.tasks import TASKS
        from toolbox.models.tiny import _model_config, build_char_tokenizer

        alphabet = cfg.model.tiny.alphabet or TASKS.build(cfg.task, inject={"data": cfg.data}).alphabet()
        config, source = _model_config(cfg.model.tiny, build_char_tokenizer(alphabet)), f"tiny {cfg.model.tiny.arch}"
    else:
        config, source = _real_model_config(cfg)
    config._attn_implementation = getattr(config, "_attn_implementation", None) or "sdpa"
    with torch.device("meta"):  # shapes only: no storage is allocated, no weights are read
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.model.trust_remote_code)
    layers = int(config.num_hidden_layers)
    blocks = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers), None)
    head = model.get_output_embeddings()
    return ModelShape(
        params=sum(p.numel() for p in model.parameters()),
        block_params=sum(p.numel() for p in blocks[0].parameters()) if blocks is not None else 0,
        output_params=sum(p.numel() for p in head.parameters()) if head is not None else 0,
        layers=layers, hidden=int(config.hidden_size), heads=int(config.num_attention_heads),
        vocab=int(config.vocab_size), max_positions=int(getattr(config, "max_position_embeddings", 0) or 0),
        source=source, kv_heads=int(getattr(config, "num_key_value_heads", 0) or 0),
        head_dim=int(getattr(config, "head_dim", 0) or 0), intermediate=int(getattr(config, "intermediate_size", 0) or 0),
        attention=str(getattr(config, "_attn_implementation", None) or "sdpa"),
        lora_params=_lora_params(model, cfg.learner.lora),
    )


def _lora_params(model: Any, lora: Any) -> int:
    """The adapters' parameters: ``r x (in + out)`` for each linear layer ``lora.target_modules`` names (all of
    them in the blocks for 'all-linear')."""
    if lora is None:
        return 0
    import torch

    targets = lora.target_modules
    return sum(lora.r * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings()
               and (targets == "all-linear" or name.rsplit(".", 1)[-1] in targets))


def _real_model_config(cfg: ExperimentConfig) -> tuple[Any, str]:
    """``model.path``'s config (a catalog name resolved), and where it came from. A GGUF not converted yet is not
    converted here: its config comes from the file's metadata, which is all a dry run reads."""
    from transformers import AutoConfig

    from toolbox.core.errors import ConfigError
    from toolbox.driver.preflight import check_model_path
    from toolbox.models.architectures import published_config
    from toolbox.models.catalog import gguf_source, gguf_target, resolve
    from toolbox.models.gguf import GGUFImportError, check_gguf_packages

    model = cfg.model
    path = resolve(model.path)  # a ConfigError naming model.path and the fetch command, as a run would raise
    published = None if (Path(path) / "config.json").is_file() else published_config(path)
    if published is not None:  # a listed hub id not fetched here: its published architecture, no download
        return published, f"{path} (published architecture)"
    if model.gguf_file:
        gguf = gguf_source(path, model.gguf_file)
        converted = gguf_target(gguf)
        if not (converted / "config.json").is_file():
            try:
                check_gguf_packages()
            except GGUFImportError as err:
                raise ConfigError(f"model.gguf_file: {err}") from None
            return AutoConfig.from_pretrained(path, gguf_file=model.gguf_file), str(gguf)
        path = str(converted)
    check_model_path(path, model.trust_remote_code)  # a ConfigError naming model.path, as a run would raise
    return AutoConfig.from_pretrained(path, trust_remote_code=model.trust_remote_code), path
