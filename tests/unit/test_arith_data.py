"""`toolbox.data.arith`: one + or - on operands up to 20, GSM8K-shaped, and the shipped files are what it generates."""

from __future__ import annotations

import json
import re
from pathlib import Path

from toolbox.data import arith
from toolbox.data.gsm8k_tiny import splits
from toolbox.rewards import REWARDS, RewardSample


def _rows() -> dict[str, list[dict[str, str]]]:
    return {split: [json.loads(line) for line in text.splitlines()]
            for split, text in splits(0, arith.SPLITS, arith.draw).items()}


def test_shipped_files_are_up_to_date() -> None:
    for split, text in splits(0, arith.SPLITS, arith.draw).items():
        shipped = (arith.DEFAULT_DIR / f"{split}.jsonl").read_text(encoding="utf-8")
        assert shipped == text, f"{arith.DEFAULT_DIR}/{split}.jsonl is stale: run `python -m toolbox.data.arith`"


def test_one_operation_small_operands_right_answers_disjoint_splits() -> None:
    rows = _rows()
    assert {split: len(r) for split, r in rows.items()} == arith.SPLITS
    for row in rows["train"] + rows["test"]:
        a, op, b, c = re.fullmatch(r"(\d+) ([-+]) (\d+) = (\d+)\n#### \d+", row["answer"]).groups()  # type: ignore[union-attr]
        assert max(int(a), int(b)) <= arith.MAX_OPERAND
        assert (int(a) + int(b) if op == "+" else int(a) - int(b)) == int(c) >= 0
        assert row["answer"].endswith(f"#### {c}")
    assert not {r["question"] for r in rows["train"]} & {r["question"] for r in rows["test"]}


def test_both_forms_in_the_held_out_split() -> None:
    bare = sum(r["question"].startswith("What is ") for r in _rows()["test"])
    assert 0.35 < bare / arith.SPLITS["test"] < 0.65  # test is drawn first, so it gets its share of bare expressions


def test_reference_scores_full_marks_and_a_wrong_number_none() -> None:
    reward = REWARDS.build({"name": "math_verify"})
    for row in _rows()["test"][:20]:
        assert reward(RewardSample(row["question"], row["answer"], {"answer": row["answer"]})) == 1.0
        assert reward(RewardSample(row["question"], "#### 1000", {"answer": row["answer"]})) == 0.0


def test_cli_writes_the_files_in_draw_order(tmp_path: Path) -> None:
    arith.main(["--out", str(tmp_path), "--seed", "1", "--train", "5", "--test", "2"])
    expected = splits(1, {"test": 2, "train": 5}, arith.draw)
    assert (tmp_path / "train.jsonl").read_text() == expected["train"]
    assert (tmp_path / "test.jsonl").read_text() == expected["test"]
