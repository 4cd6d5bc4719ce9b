"""The GRPO-vs-TRL benchmark's models: random Qwen2 models with a byte-level BPE tokenizer trained here.

Two sizes: ``small`` (~4M parameters) and ``medium`` (~25M). The tokenizer is trained
with the `tokenizers` library on a deterministic corpus of the task's own text (digit_add sums and their
answers), so nothing is downloaded and both frameworks load the very same directory. Not a language
model of any use: the weights are random (seeded), which is all a throughput benchmark needs.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SPECIAL = ["<pad>", "<s>", "</s>"]
VOCAB_SIZE = 512  # 256 byte symbols + 3 specials + merges learnt from the corpus
MAX_POSITIONS = 512


@dataclass(frozen=True)
class ModelShape:
    """Sizes of one benchmark model (Qwen2 names)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


MODELS: dict[str, ModelShape] = {
    "small": ModelShape(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=1024),
    "medium": ModelShape(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                         intermediate_size=1536),
}


def corpus(n: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic training text for the tokenizer: sums of up to four operands with their answers."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        xs = [rng.randint(0, 99) for _ in range(rng.randint(2, 4))]
        lines.append("+".join(map(str, xs)) + "=" + str(sum(xs)))
    return lines


def train_bpe_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` (GPT-2 style: any byte string encodes) trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token=None)
    tok.model_max_length = MAX_POSITIONS
    return tok


def model_config(shape: ModelShape, tokenizer: Any) -> Any:
    """The ``Qwen2Config`` of ``shape`` for ``tokenizer`` (tied embeddings, as small Qwen2 models have)."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, **asdict(shape))


def build_model(root: str | Path, name: str, seed: int = 0) -> str:
    """Write model ``name`` (a key of `MODELS`) and its tokenizer to ``root/name``; returns the directory."""
    import torch
    from transformers import AutoModelForCausalLM

    if name not in MODELS:
        raise ValueError(f"--model: {name!r} is not a benchmark model; choose from {sorted(MODELS)}")
    target = Path(root) / name
    tokenizer = train_bpe_tokenizer(corpus())
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(model_config(MODELS[name], tokenizer))
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    model.generation_config.save_pretrained(target)
    return str(target)


def num_parameters(path: str) -> int:
    """Parameters of a saved benchmark model (tied embeddings counted once)."""
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
