"""The published architectures of a few real models, as transformers config objects built without the hub.

A dry run of a recipe at real size needs the model's shape (layers, widths, heads, vocabulary), not its weights;
these are the numbers each model's ``config.json`` publishes, so `toolbox.driver.dry_run` plans a 7B run on a machine
that never fetched it. A local directory with a ``config.json`` (a fetched model) always takes precedence.

Not here: weights, tokenizers, or any model not listed (their configs come from ``model.path`` as usual).
"""

from __future__ import annotations

from typing import Any

# hub id (and its base model) -> (architecture, config.json fields)
_QWEN25 = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768}
PUBLISHED: dict[str, tuple[str, dict[str, Any]]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": ("qwen2", {**_QWEN25, "num_hidden_layers": 24, "hidden_size": 896,
                                             "num_attention_heads": 14, "num_key_value_heads": 2,
                                             "intermediate_size": 4864, "vocab_size": 151936,
                                             "tie_word_embeddings": True}),
    "Qwen/Qwen2.5-1.5B-Instruct": ("qwen2", {**_QWEN25, "num_hidden_layers": 28, "hidden_size": 1536,
                                             "num_attention_heads": 12, "num_key_value_heads": 2,
                                             "intermediate_size": 8960, "vocab_size": 151936,
                                             "tie_word_embeddings": True}),
    "Qwen/Qwen2.5-7B-Instruct": ("qwen2", {**_QWEN25, "num_hidden_layers": 28, "hidden_size": 3584,
                                           "num_attention_heads": 28, "num_key_value_heads": 4,
                                           "intermediate_size": 18944, "vocab_size": 152064,
                                           "tie_word_embeddings": False}),
    "meta-llama/Llama-3.1-8B-Instruct": ("llama", {"num_hidden_layers": 32, "hidden_size": 4096,
                                                   "num_attention_heads": 32, "num_key_value_heads": 8,
                                                   "intermediate_size": 14336, "vocab_size": 128256,
                                                   "tie_word_embeddings": False, "max_position_embeddings": 131072,
                                                   "rms_norm_eps": 1e-5, "rope_theta": 500000.0}),
}
for _instruct in list(PUBLISHED):  # the base models share their instruct variant's architecture
    PUBLISHED[_instruct.removesuffix("-Instruct")] = PUBLISHED[_instruct]


def published_config(hub_id: str) -> Any | None:
    """``hub_id``'s architecture as a transformers config (Qwen2Config / LlamaConfig), or None when not listed."""
    if hub_id not in PUBLISHED:
        return None
    from transformers import AutoConfig

    arch, fields = PUBLISHED[hub_id]
    return AutoConfig.for_model(arch, **fields)
