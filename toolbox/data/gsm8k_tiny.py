"""A tiny GSM8K-style data set: arithmetic word problems whose solutions end in ``#### N``.

Rows have GSM8K's two fields, ``question`` and ``answer`` (the worked solution, last line
``#### N``), so a recipe that runs on this file runs on GSM8K itself. Problems are one or two steps
of +, -, * and / on small whole numbers, generated from a seed: the same seed gives the same files,
byte for byte. The repo ships the output under ``configs/data/gsm8k_tiny/`` and a test checks it is
what this module generates. Not a benchmark: it exists to run a recipe end to end on a laptop.
GSM8K's ``<<3+4=7>>`` calculator notes are left out to keep the character set (and so a tiny
model's char-level vocabulary) small.

Regenerate with ``python -m toolbox.data.gsm8k_tiny`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

NAMES = ("Ava", "Ben", "Cleo", "Dan", "Eli", "Fay", "Gus", "Ivy", "Jo", "Kai", "Liam", "Mia", "Noah", "Omar",
         "Pia", "Rosa", "Sam", "Tara", "Uma", "Zoe")
ITEMS = ("apples", "marbles", "books", "pencils", "cookies", "stickers", "shells", "cards")
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "configs" / "data" / "gsm8k_tiny"
SPLITS = {"train": 320, "test": 64}


@dataclass(frozen=True)
class WordProblem:
    """One row: the question, and the worked solution ending in ``#### answer``."""

    question: str
    steps: tuple[str, ...]
    answer: int

    def row(self) -> dict[str, str]:
        """The GSM8K-shaped record: ``question`` and ``answer`` (solution text + ``#### N``)."""
        return {"question": self.question, "answer": "\n".join((*self.steps, f"#### {self.answer}"))}


def _buy(rng: random.Random, name: str, item: str) -> WordProblem:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    return WordProblem(f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?",
                       (f"{name} has {a} + {b} = {a + b} {item}.",), a + b)


def _give(rng: random.Random, name: str, item: str) -> WordProblem:
    a = rng.randint(10, 50)
    b = rng.randint(1, a - 1)
    return WordProblem(f"{name} has {a} {item} and gives away {b}. How many {item} are left?",
                       (f"{a} - {b} = {a - b} {item} are left.",), a - b)


def _bags(rng: random.Random, name: str, item: str) -> WordProblem:
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    return WordProblem(f"{name} has {a} bags with {b} {item} in each bag. How many {item} is that?",
                       (f"{a} * {b} = {a * b} {item}.",), a * b)


def _share(rng: random.Random, name: str, item: str) -> WordProblem:
    each, friends = rng.randint(2, 12), rng.randint(2, 6)
    total = each * friends
    return WordProblem(f"{name} shares {total} {item} equally among {friends} friends. How many {item} does "
                       "each friend get?", (f"{total} / {friends} = {each} {item} each.",), each)


def _packs(rng: random.Random, name: str, item: str) -> WordProblem:
    a, packs, per = rng.randint(1, 20), rng.randint(2, 6), rng.randint(2, 10)
    bought = packs * per
    return WordProblem(f"{name} has {a} {item} and buys {packs} packs of {per}. How many {item} does "
                       f"{name} have?", (f"{packs} * {per} = {bought} {item} bought.",
                                         f"{a} + {bought} = {a + bought} {item}."), a + bought)


def _change(rng: random.Random, name: str, item: str) -> WordProblem:
    price, count = rng.randint(1, 9), rng.randint(2, 5)
    cost = price * count
    paid = cost + rng.randint(1, 20)
    return WordProblem(f"{item.capitalize()} cost ${price} each. {name} buys {count} and pays ${paid}. "
                       f"How much change does {name} get?",
                       (f"{count} * {price} = ${cost}.", f"{paid} - {cost} = ${paid - cost}."), paid - cost)


KINDS: tuple[Callable[[random.Random, str, str], WordProblem], ...] = (_buy, _give, _bags, _share, _packs, _change)


def draw(rng: random.Random) -> WordProblem:
    """One problem from ``rng``: its kind, name and item uniformly, then its numbers."""
    return rng.choice(KINDS)(rng, rng.choice(NAMES), rng.choice(ITEMS))


def render(problems: list[WordProblem]) -> str:
    """JSON Lines text, one ``{"question", "answer"}`` object a line."""
    return "".join(json.dumps(p.row()) + "\n" for p in problems)


def splits(seed: int = 0, sizes: dict[str, int] | None = None,
           draw_one: Callable[[random.Random], WordProblem] = draw) -> dict[str, str]:
    """The JSONL text of each split. One generator over all splits, so no row is in two of them."""
    rng = random.Random(seed)
    out: dict[str, str] = {}
    seen: set[str] = set()
    for split, size in (sizes or SPLITS).items():
        rows: list[WordProblem] = []
        while len(rows) < size:
            problem = draw_one(rng)
            if problem.question not in seen:  # a held-out question never repeats a training one
                seen.add(problem.question)
                rows.append(problem)
        out[split] = render(rows)
    return out


def write_splits(draw_one: Callable[[random.Random], WordProblem], out_dir: Path, seed: int,
                 sizes: dict[str, int]) -> list[Path]:
    """Write ``out_dir/{split}.jsonl`` for every split of problems drawn by ``draw_one``; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, text in splits(seed, sizes, draw_one).items():
        path = out_dir / f"{split}.jsonl"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def write(out_dir: Path, seed: int = 0, sizes: dict[str, int] | None = None) -> list[Path]:
    """Write ``out_dir/{split}.jsonl`` for every split; return the paths."""
    return write_splits(draw, out_dir, seed, sizes or SPLITS)


def cli(doc: str | None, write_fn: Callable[[Path, int, dict[str, int]], list[Path]], default_dir: Path,
        sizes: dict[str, int], argv: list[str] | None) -> None:
    """The ``--out --seed --train --test`` command line of a generator module; prints the files written."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--out", type=Path, default=default_dir, help="directory of {train,test}.jsonl")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same files")
    parser.add_argument("--train", type=int, default=sizes["train"], help="rows in train.jsonl")
    parser.add_argument("--test", type=int, default=sizes["test"], help="rows in test.jsonl")
    args = parser.parse_args(argv)
    chosen = {split: getattr(args, split) for split in sizes}  # in the order of ``sizes``: the draw order
    for path in write_fn(args.out, args.seed, chosen):
        print(path)  # the CLI's output: the files written


def main(argv: list[str] | None = None) -> None:
    """``python -m toolbox.data.gsm8k_tiny [--out DIR] [--seed N] [--train N] [--test N]``."""
    cli(__doc__, write, DEFAULT_DIR, SPLITS, argv)


if __name__ == "__main__":
    main()
