"""Build a tiny random-init causal LM and a char-level tokenizer, saved as a normal model directory.

Deterministic (seeded) and written atomically (temp dir + rename), so every worker
may call `ensure_tiny_model` on the same path and they all load identical weights.

With ``$TOOLBOX_TINY_CACHE`` set, each tiny model is built once into that directory (under a name that digests its
family, sizes, seed and alphabet) and copied from there to every path that asks for it: many runs in fresh run roots
(a test suite's) then build each model once instead of once per run root. Unset, nothing is kept
outside the asked path: a cache that outlives a change to how tiny models are built would hand out stale ones, so
it is for a directory whose life is that of the runs it serves (the test suite sets one per pytest run).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from toolbox.models.loading import TinyModelConfig

SPECIAL = ["<pad>", "<s>", "</s>"]
TINY_CACHE_ENV = "TOOLBOX_TINY_CACHE"


def build_char_tokenizer(alphabet: str):  # noqa: ANN201 - transformers type
    """A ``PreTrainedTokenizerFast`` with one token per character of ``alphabet``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(alphabet))
    vocab = {tok: i for i, tok in enumerate(SPECIAL + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # decode "12" as "12", not WordLevel's space-joined "1 2"
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<pad>"
    )


def _model_config(cfg: TinyModelConfig, tokenizer):  # noqa: ANN001, ANN202
    """The transformers config of a tiny ``cfg.arch`` model over ``tokenizer``'s vocabulary."""
    from transformers import LlamaConfig, Qwen2Config

    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}.get(cfg.arch)
    if cls is None:
        raise ValueError(f"model.tiny.arch: {cfg.arch!r} is not supported; allowed: 'qwen2', 'llama'")
    return cls(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def ensure_tiny_model(path: str | os.PathLike[str], cfg: TinyModelConfig, alphabet: str, family: str = "hf",
                      apart: bool = False) -> Path:
    """Write a tiny model of ``family`` (`toolbox.models.causal_lm.MODELS`) + tokenizer to ``path`` unless one is
    already there; return the path.

    ``apart`` (the driver): build it in a child process unless this process has loaded transformers' modeling
    code already. The driver only reads the tokenizer; building the model would import the modeling code into
    it for the whole run: about 90 MiB more at the run's peak (`toolbox bench default_run`, the first run of a
    fresh ``run_root``), for ~1 CPU s of the child's own torch import, spent while Ray starts."""
    target = Path(path)
    if (target / "config.json").exists():
        return target  # before importing transformers: the driver resolves the path before any actor starts
    cache = os.environ.get(TINY_CACHE_ENV)
    if cache and Path(cache).resolve() != target.parent.resolve():
        digest = hashlib.sha1(f"{family}|{cfg.model_dump_json()}|{alphabet}".encode()).hexdigest()[:12]
        built = ensure_tiny_model(Path(cache) / f"tiny-{family}-{digest}", cfg, alphabet, family, apart)
        _place(lambda tmp: shutil.copytree(built, tmp, dirs_exist_ok=True), target)
        return target
    if apart and "transformers.modeling_utils" not in sys.modules:
        _build_in_child(target, cfg, alphabet, family)
        return target
    from toolbox.models.causal_lm import MODELS

    tokenizer = build_char_tokenizer(cfg.alphabet or alphabet)
    tokenizer.model_max_length = cfg.max_positions  # stated, so a prompt longer than the model is a bad row

    def build(tmp: Path) -> None:
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            MODELS.get(family).factory().save_tiny(cfg, tokenizer, tmp)
        tokenizer.save_pretrained(tmp)

    _place(build, target)
    return target


def _place(write: Callable[[Path], object], target: Path) -> None:
    """``write`` a directory next to ``target``, then rename it to ``target``: another process sees the whole
    model or none. One that got there first wins; its copy is identical."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    write(tmp)
    try:
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def _build_in_child(target: Path, cfg: TinyModelConfig, alphabet: str, family: str) -> None:
    """`ensure_tiny_model` in a fresh Python process; its error, if any, raised here with the child's last words."""
    code = ("import sys; from toolbox.models.loading import TinyModelConfig; from toolbox.models.tiny import "
            "ensure_tiny_model; ensure_tiny_model(sys.argv[1], TinyModelConfig.model_validate_json(sys.argv[2]), "
            "sys.argv[3], sys.argv[4])")
    done = subprocess.run([sys.executable, "-c", code, str(target), cfg.model_dump_json(), alphabet, family],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0 or not (target / "config.json").exists():
        raise RuntimeError(f"building the tiny model at {target} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
