"""``toolbox bench recipe``: the figures and examples tables, read from a run directory; no run started."""

from __future__ import annotations

import json
from pathlib import Path

from toolbox.bench import recipe


def _eval_dir(run: Path, name: str, responses: list[str], rewards: list[float]) -> None:
    (run / name).mkdir(parents=True)
    rows = [{"prompt": f"system\nS\nuser\nWhat is {i} + 1?\nassistant\n", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}",
             "responses": [r], "rewards": [w]} for i, (r, w) in enumerate(zip(responses, rewards))]
    (run / name / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_examples_pair_base_and_trained_in_split_order(tmp_path: Path) -> None:
    _eval_dir(tmp_path, "eval-base", ["Sure! 0 + 1\nis", "2", "x", "y", "z"], [0.0, 1.2, 0.0, 0.0, 0.0])
    _eval_dir(tmp_path, "eval", ["#### 1", "#### 2", "#### 3", "#### 5", "#### 5"], [1.2, 1.2, 1.2, 0.2, 1.2])
    table = recipe.examples_table(tmp_path)
    assert len(table.rows) == 4  # the first four, not the best four
    assert table.rows[0] == ["What is 0 + 1?", "1", "`Sure! 0 + 1 is` (wrong)", "`#### 1` (right)"]
    assert table.rows[3][3] == "`#### 5` (wrong)"


def test_figures_table_and_the_command_a_report_names() -> None:
    figures = {"experiment": "x", "wall_s": 700.4, "peak_pss_gib": 3.456,
               "base": {"pass@1": 0.2, "prompts": 200}, "trained": {"pass@1": 0.61, "prompts": 200}}
    rows = recipe.figures_table(figures).rows
    assert rows[0][1] == "700 s" and rows[1][1] == "3.46 GiB"
    assert rows[2] == ["held-out pass@1, base", "0.200 (200 prompts)"]
    assert rows[3] == ["held-out pass@1, trained", "0.610 (200 prompts)"]
    assert recipe._without_figures(["x", "--figures", "f.json", "--report", "r.md"]) == ["x", "--report", "r.md"]
