"""`toolbox.data.gsm8k_tiny`: deterministic, GSM8K-shaped, and the shipped files are what it generates."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from toolbox.data import gsm8k_tiny
from toolbox.rewards import REWARDS, RewardSample

SHIPPED = gsm8k_tiny.DEFAULT_DIR


def test_same_seed_same_text_other_seed_other_text() -> None:
    sizes = {"train": 40, "test": 10}
    assert gsm8k_tiny.splits(3, sizes) == gsm8k_tiny.splits(3, sizes)
    assert gsm8k_tiny.splits(3, sizes)["train"] != gsm8k_tiny.splits(4, sizes)["train"]


def test_shipped_files_are_up_to_date() -> None:
    expected = gsm8k_tiny.splits()
    assert sorted(p.name for p in SHIPPED.glob("*.jsonl")) == sorted(f"{s}.jsonl" for s in expected)
    for split, text in expected.items():
        shipped = (SHIPPED / f"{split}.jsonl").read_text(encoding="utf-8")
        assert shipped == text, f"{SHIPPED}/{split}.jsonl is stale: run `python -m toolbox.data.gsm8k_tiny`"


def test_rows_are_gsm8k_shaped_small_and_disjoint() -> None:
    rows = {split: [json.loads(line) for line in text.splitlines()] for split, text in gsm8k_tiny.splits().items()}
    assert {split: len(r) for split, r in rows.items()} == gsm8k_tiny.SPLITS
    assert sum((SHIPPED / f"{s}.jsonl").stat().st_size for s in rows) < 100_000
    for row in rows["train"] + rows["test"]:
        assert set(row) == {"question", "answer"}
        assert re.fullmatch(r"(?s).+\n#### \d+", row["answer"]), row
    train_questions = {r["question"] for r in rows["train"]}
    assert not train_questions & {r["question"] for r in rows["test"]}
    assert len(train_questions) == len(rows["train"])


def test_every_kind_solution_is_arithmetically_right() -> None:
    rng = random.Random(0)
    for kind in gsm8k_tiny.KINDS:
        for _ in range(50):
            problem = kind(rng, "Ava", "apples")
            for step in problem.steps:  # each "a op b = c" in the worked solution holds
                for a, op, b, c in re.findall(r"(\d+) ([-+*/]) \$?(\d+) = \$?(\d+)", step):
                    assert eval(f"{a} {op} {b}") == int(c), (kind.__name__, step)  # noqa: S307 - digits only
            assert problem.row()["answer"].endswith(f"#### {problem.answer}")
            assert problem.answer >= 0


def test_reference_solutions_score_full_marks_with_math_verify() -> None:
    reward = REWARDS.build({"name": "math_verify"})
    rows = [json.loads(line) for line in gsm8k_tiny.splits()["test"].splitlines()[:20]]
    assert all(reward(RewardSample(r["question"], r["answer"], {"answer": r["answer"]})) == 1.0 for r in rows)
    assert all(reward(RewardSample(r["question"], "#### 1000", {"answer": r["answer"]})) == 0.0 for r in rows)


def test_cli_writes_the_files(tmp_path: Path) -> None:
    gsm8k_tiny.main(["--out", str(tmp_path), "--seed", "1", "--train", "5", "--test", "2"])
    assert (tmp_path / "train.jsonl").read_text() == gsm8k_tiny.splits(1, {"train": 5, "test": 2})["train"]
    assert len((tmp_path / "test.jsonl").read_text().splitlines()) == 2
