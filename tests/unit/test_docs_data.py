"""The data examples of docs/your-data.md load as the page says: every fenced block after ``<!-- data: KIND -->``.

Each block is written to a file with its language as the suffix (``jsonl``, ``json``, ``csv``, ``txt``) and read by
the code a run reads it with: prompts by the ``dataset`` task (``task.prompt_field=question``), SFT and preference
records by `load_records`. A block that stops loading, or loads into a different number of rows than it shows,
fails here rather than in a user's run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from toolbox.data.dataset_task import DatasetTask, DatasetTaskConfig
from toolbox.data.offline import load_records

PAGE = Path(__file__).resolve().parents[2] / "docs" / "your-data.md"
BLOCK = re.compile(r"^<!-- data: (\w+) -->\n```(\w+)\n(.*?)^```$", re.S | re.M)
KINDS = {"prompts", "sft", "preference"}


@dataclass(frozen=True)
class Example:
    """One data block of the page: what it holds, its file type, its text and the line it starts on."""

    kind: str
    suffix: str
    text: str
    line: int

    def __str__(self) -> str:
        return f"your-data.md:{self.line}:{self.kind}.{self.suffix}"

    def rows_shown(self) -> int:
        """How many rows the block shows: documents of a .txt, array items of a .json, lines otherwise."""
        if self.suffix == "txt":
            return len([doc for doc in self.text.split("\n\n") if doc.strip()])
        if self.suffix == "json":
            return self.text.count('{"')
        return len(self.text.strip().splitlines()) - (self.suffix == "csv")  # a csv's header is not a row


def examples(page: Path = PAGE) -> list[Example]:
    return [Example(m.group(1), m.group(2), m.group(3), page.read_text().count("\n", 0, m.start()) + 1)
            for m in BLOCK.finditer(page.read_text())]


def test_the_page_shows_each_kind_with_three_rows() -> None:
    found = examples()
    assert {e.kind for e in found} == KINDS
    assert {(e.kind, e.suffix) for e in found} >= {("prompts", "jsonl"), ("prompts", "csv"), ("prompts", "json"),
                                                   ("sft", "jsonl"), ("sft", "txt"), ("preference", "jsonl")}
    assert all(e.rows_shown() == 3 for e in found), [str(e) for e in found if e.rows_shown() != 3]


@pytest.mark.parametrize("example", examples(), ids=str)
def test_a_data_example_loads_as_the_page_says(example: Example, tmp_path: Path) -> None:
    path = tmp_path / f"data.{example.suffix}"
    path.write_text(example.text)

    if example.kind == "prompts":
        task = DatasetTask(DatasetTaskConfig(path=str(path), prompt_field="question", answer_field="answer"))
        problems = task.train_problems()
        assert [p.answer for p in problems] == ["7", "3", "3"]
        assert problems[1].prompt == "Tom has 5 apples and eats 2. How many are left?"
    else:
        records = load_records(path, "preference" if example.kind == "preference" else "sft")
        assert len(records) == example.rows_shown()
