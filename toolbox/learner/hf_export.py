"""Trained weights as a Hugging Face model directory: what ``AutoModelForCausalLM.from_pretrained`` loads.

Weights go into a fresh ``from_pretrained`` copy of the base model, so the directory's
config, generation config and tokenizer are the base model's own and only the weights are
new; ``save_pretrained`` writes them as safetensors. Two sources use it: the learner's
gathered full state dict (`PolicyRank.export_hf`, at the end of a run) and a DCP
checkpoint read on one process (`toolbox.learner.checkpoint.load_model_weights`, for ``toolbox export``).
Only the policy is written; a critic or reference model is not.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from toolbox.models.loading import load_causal_lm


def base_model(source: str, dtype: str = "float32", trust_remote_code: bool = False) -> Any:
    """A fresh copy of the base model (``from_pretrained(source)``), in eval mode, to load trained weights into."""
    return load_causal_lm(source, dtype, trust_remote_code).eval()


def load_full_state(model: Any, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy a full (unsharded) policy state dict into ``model``; every name must match (``where`` names the source)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{where}: the weights do not fit the base model {model.name_or_path!r}: "
                         f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")


def write_hf_dir(model: Any, source: str, out: str | Path, trust_remote_code: bool = False) -> Path:
    """``save_pretrained`` the model (safetensors, config, generation config) and the base model's tokenizer."""
    from toolbox.models.loading import load_tokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)  # generation_config.json too, for a model that can generate
    # The tokenizer the run used (load_tokenizer keeps a char-level tokenizer's own class), saved as it is.
    load_tokenizer(source, trust_remote_code).save_pretrained(out)
    return out


def export_state(state: dict[str, torch.Tensor], source: str, dtype: str, out: str | Path,
                 loader: Callable[[str, str], Any] = load_causal_lm) -> Path:
    """A full policy state dict (a learner's, gathered on rank 0) as a Hugging Face directory at ``out``."""
    model = loader(source, dtype).eval()  # the class it was trained as (a causal LM, or a reward model)
    load_full_state(model, state, "learner state dict")
    return write_hf_dir(model, source, out)
