"""Convert a GGUF file into a plain Hugging Face model directory: float32 safetensors, tokenizer, generation config.

transformers reads a GGUF (dequantizing its blocks) but refuses to save the model it loaded, so the weights are
copied into a fresh model built from the same config, which saves like any other. Learners, engines, eval, serve
and export then load that directory and never learn it came from a GGUF. Written atomically (temp dir + rename,
as `toolbox.models.tiny` does), so a reader sees a whole directory or none.

Not covered: architectures transformers cannot read from GGUF (it says which), and keeping the weights
quantized: the directory holds float32, several times the file's size, and the conversion holds two copies of
the model in memory while it runs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from toolbox.core.errors import ToolboxError
from toolbox.core.extras import needs_extra

GGUF_MAGIC = b"GGUF"
# transformers' "no limit" sentinel for model_max_length is about 1e30; anything above this is unset.
_UNSET_MAX_LENGTH = 10**12


class GGUFImportError(ToolboxError):
    """A GGUF file cannot be converted; the message names the file and the reason."""


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic bytes."""
    try:
        with Path(path).open("rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def check_gguf_file(gguf_file: Path) -> None:
    """`GGUFImportError` unless ``gguf_file`` is an existing GGUF file (its magic bytes, nothing else, are read)."""
    if not gguf_file.is_file():
        raise GGUFImportError(f"{gguf_file}: no such file")
    if not is_gguf(gguf_file):
        raise GGUFImportError(f"{gguf_file}: not a GGUF file (it does not start with the bytes {GGUF_MAGIC!r})")


def check_gguf_packages() -> None:
    """`GGUFImportError` naming the extra to install when transformers' GGUF reader lacks a package."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise GGUFImportError(needs_extra("reading a GGUF file", "gguf", f"{', '.join(missing)} not installed"))


def import_gguf(gguf_file: Path, out_dir: Path) -> Path:
    """Convert ``gguf_file`` into the Hugging Face directory ``out_dir`` (created; must not hold files yet).

    The model is saved in float32 (its config's dtype), beside its tokenizer and generation config. Raises
    `GGUFImportError` when the file is missing, is not a GGUF transformers can read, or the gguf extra is
    not installed. Returns ``out_dir``.
    """
    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    check_gguf_file(gguf_file)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise GGUFImportError(f"{out_dir}: already exists and is not an empty directory; name a new one")
    check_gguf_packages()
    model, tokenizer = _load(gguf_file)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache's model from the other users of the machine
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        for written in tmp.iterdir():
            written.chmod(0o644)  # safetensors files are written 0600; a shared cache needs them readable
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.rename(tmp, out_dir)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out_dir / "config.json").is_file():
            raise
        # another process converted the same file first; its copy is the same conversion
    return out_dir


def _load(gguf_file: Path) -> tuple[Any, Any]:
    """The dequantized model, as a plain (saveable) float32 model, and its tokenizer."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(gguf_file.parent), gguf_file.name
    options: dict[str, Any] = {"gguf_file": name, "dtype": torch.float32}
    if hasattr(transformers, "GgufConfig"):  # with the `kernels` package it would keep the blocks packed otherwise
        options["quantization_config"] = transformers.GgufConfig(dequantize=True)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(where, **options)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as err:
        raise GGUFImportError(f"{gguf_file}: transformers {transformers.__version__} cannot read it as a causal "
                              f"LM: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain float32; nothing is quantized any more
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())  # strict: every tensor of the GGUF lands, none is left random
    model.generation_config = loaded.generation_config
    del loaded
    positions = getattr(config, "max_position_embeddings", None)
    if positions and (tokenizer.model_max_length or 0) > _UNSET_MAX_LENGTH:
        tokenizer.model_max_length = int(positions)  # stated, so a prompt longer than the model is a bad row
    return model, tokenizer
