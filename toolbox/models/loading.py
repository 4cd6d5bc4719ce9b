"""Load a causal LM and its tokenizer the way a user's own model is loaded.

Everything goes through ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``,
so a local directory and a hub id take the same path. Tiny models are first written
to a directory (see `toolbox.models.tiny`) and then loaded back here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toolbox.core.errors import ConfigError


class TinyModelConfig(BaseModel):
    """A tiny random-init model built from a transformers config (tests, default experiment)."""

    model_config = ConfigDict(extra="forbid")
    arch: Literal["qwen2", "llama"] = Field("qwen2", description="Architecture of the tiny model (model.name hf).")
    hidden_size: int = Field(64, ge=8, description="Width of the residual stream.")
    num_layers: int = Field(2, ge=1, description="Transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads.")
    num_kv_heads: int = Field(2, ge=1, description="Key/value heads (grouped-query attention; model.name hf).")
    intermediate_size: int = Field(256, ge=8, description="MLP width.")
    max_positions: int = Field(64, ge=8, description="Longest sequence the model accepts.")
    alphabet: str = Field("", description="Characters of the char-level tokenizer; empty: the task's alphabet.")
    seed: int = Field(0, description="Seed of the random init; same seed, same weights.")


class ColdStartConfig(BaseModel):
    """A short supervised run (e.g. SFT on demonstration episodes) whose exported policy this run starts from."""

    model_config = ConfigDict(extra="forbid")
    experiment: str = Field(description="The SFT experiment (a name under configs/experiments/ or a YAML path) run "
                            "first, in this process (ray.local_mode, one learner rank), on this run's model.")
    overrides: list[str] = Field([], description="Dotted overrides of that experiment (`trainer.total_steps=50`).")


class ModelConfig(BaseModel):
    """Which policy to train."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field("hf", description="Model family (toolbox.models.causal_lm.MODELS): hf (transformers' "
                      "AutoModelForCausalLM), gpt (toolbox's from-scratch GPT in plain torch) or a plugin's. A saved "
                      "directory declares its own family; this picks the one a tiny model is built as.")
    path: str = Field(
        "",
        description="Hub id or local directory loaded with from_pretrained, or a catalog name "
        "(`toolbox model list`; fetched first with `toolbox model fetch NAME`). Empty with `tiny` set: "
        "a tiny model is built under the run directory.",
    )
    tiny: TinyModelConfig | None = Field(
        default_factory=TinyModelConfig, description="Build a tiny random-init model at `path` if it is absent."
    )
    gguf_file: str = Field("", description="A GGUF file name inside `model.path` (a directory): converted once "
                           "into a float32 Hugging Face directory under the model cache ($TOOLBOX_MODEL_CACHE/gguf), "
                           "which every worker then loads. Needs model.tiny=null and the gguf extra. Empty: none.")
    dtype: str = Field("float32", description="Parameter dtype: float32 or bfloat16.")
    trust_remote_code: bool = Field(False, description="Passed to from_pretrained.")
    cold_start: ColdStartConfig | None = Field(None, description="Start from the policy a supervised run "
                                               "exports (cold start before RL, as DeepSeek-R1 and tool-use "
                                               "trainers do); cached under run_root/.models. Null: none.")

    @field_validator("name")
    @classmethod
    def _registered(cls, value: str) -> str:
        from toolbox.models.causal_lm import MODELS

        if value not in MODELS:
            raise ValueError(f"{value!r} is not a registered model family; allowed: {MODELS.names()}")
        return value

    @model_validator(mode="after")
    def _real_model_needs_no_tiny(self) -> ModelConfig:
        """A GGUF file or a catalog name is a real model: with `tiny` set a random tiny model would be built at
        `path` instead (or the directory would be taken as the tiny model's), silently."""
        from toolbox.models.catalog import CATALOG

        if self.tiny is None:
            return self
        if self.gguf_file:
            raise ConfigError(f"model.gguf_file: {self.gguf_file!r} is a real model, but model.tiny is set (it "
                              "would build a random tiny model instead); add model.tiny=null")
        if self.path in CATALOG:
            raise ConfigError(f"model.path: {self.path!r} is a catalog model, but model.tiny is set (it would build "
                              f"a random tiny model at ./{self.path}); add model.tiny=null")
        return self


def load_tokenizer(path: str, trust_remote_code: bool = False):  # noqa: ANN201 - transformers type
    """``AutoTokenizer.from_pretrained(path)`` with a pad token guaranteed."""
    if _declares_generic_tokenizer(path):
        # transformers 5 replaces a generic tokenizer by the model type's own class (a qwen2 directory gets
        # Qwen2Tokenizer), whose pre-tokenizer drops the spaces of a char-level vocabulary: load what it declares
        # (without importing AutoTokenizer's registry of every model type: ~0.4 CPU s in the driver's start).
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _declares_generic_tokenizer(path: str) -> bool:
    """Whether a local model directory's tokenizer_config.json names the generic tokenizers-backed class."""
    import json
    from pathlib import Path

    config = Path(path) / "tokenizer_config.json"
    if not config.is_file():
        return False
    declared = json.loads(config.read_text()).get("tokenizer_class", "")
    return declared in {"TokenizersBackend", "PreTrainedTokenizerFast"}


def load_causal_lm(path: str, dtype: str = "float32", trust_remote_code: bool = False):  # noqa: ANN201
    """The causal LM saved at ``path`` in ``dtype``, by the family its directory declares
    (`toolbox.models.causal_lm.MODELS`: ``AutoModelForCausalLM.from_pretrained`` for a transformers one)."""
    from toolbox.models.causal_lm import MODELS, family_of

    return MODELS.get(family_of(path)).factory().load(path, dtype, trust_remote_code)
