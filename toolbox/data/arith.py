"""Small-number arithmetic for a real model: one + or - on operands up to 20, GSM8K-shaped.

Half the rows are bare expressions (``What is 13 - 5?``), half one-sentence word problems
(``Mia has 13 shells and gives away 5. How many shells does Mia have left?``). Rows have GSM8K's
two fields, ``question`` and ``answer`` (one worked line, then ``#### N``), so the recipe
``grpo_smollm2_arith`` reads them through the ``dataset`` task and `toolbox eval` scores any other
directory of the same shape (``task.path=DIR`` with ``train.jsonl`` and ``test.jsonl``).
Subtractions never go below zero. Generated from a seed: the same seed gives the same files, byte
for byte; the repo ships the output under ``configs/data/arith/`` and a test checks it is what this
module generates. A held-out question never repeats a training one.

Regenerate with ``python -m toolbox.data.arith`` (``--help`` for the options).
"""

from __future__ import annotations

import random
from pathlib import Path

from toolbox.data.gsm8k_tiny import ITEMS, NAMES, WordProblem, cli, write_splits

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "configs" / "data" / "arith"
SPLITS = {"test": 200, "train": 1000}  # test first: it gets its share of the 672 distinct bare expressions
MAX_OPERAND = 20


def _operands(rng: random.Random, op: str) -> tuple[int, int]:
    a, b = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)
    return (max(a, b), min(a, b)) if op == "-" else (a, b)


def draw(rng: random.Random) -> WordProblem:
    """One problem from ``rng``: the operation, the form (bare or word problem), then its numbers."""
    op = rng.choice("+-")
    a, b = _operands(rng, op)
    result = a + b if op == "+" else a - b
    work = (f"{a} {op} {b} = {result}",)
    if rng.random() < 0.5:
        return WordProblem(f"What is {a} {op} {b}?", work, result)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if op == "+":
        question = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
    else:
        question = f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?"
    return WordProblem(question, work, result)


def write(out_dir: Path, seed: int = 0, sizes: dict[str, int] | None = None) -> list[Path]:
    """Write ``out_dir/{split}.jsonl`` for every split; return the paths."""
    return write_splits(draw, out_dir, seed, sizes or SPLITS)


def main(argv: list[str] | None = None) -> None:
    """``python -m toolbox.data.arith [--out DIR] [--seed N] [--train N] [--test N]``."""
    cli(__doc__, write, DEFAULT_DIR, SPLITS, argv)


if __name__ == "__main__":
    main()
