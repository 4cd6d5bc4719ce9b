"""The ``dataset`` task's prompts on SmolLM2: rendered with the model's own ChatML template, system prompt first,
ending in the assistant's generation prompt, with no BOS or other token added around it.

Not covered: templates of other models, SFT records (`toolbox.data.encode.encode_messages`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from toolbox.data.tasks import TASKS

pytestmark = pytest.mark.slow

QUESTION = "Pia has 17 apples and gives away 3. How many apples does Pia have left?"
SYSTEM = "Answer with the number only, after ####."


def task(tmp_path: Path, system_prompt: str):  # noqa: ANN201 - DatasetTask
    data = tmp_path / "arith.jsonl"
    data.write_text(json.dumps({"question": QUESTION, "answer": "17 - 3 = 14\n#### 14"}) + "\n")
    return TASKS.build({"name": "dataset", "path": str(data), "prompt_field": "question", "answer_field": "answer",
                        "system_prompt": system_prompt})


def test_prompt_ids_are_the_chatml_rendering_with_the_system_prompt(smollm2_tokenizer: Any, tmp_path: Path) -> None:
    tok = smollm2_tokenizer
    dataset = task(tmp_path, SYSTEM)
    (problem,) = dataset.train_problems()
    ids = dataset.prompt_ids(problem, tok)
    assert tok.decode(ids) == (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n"
                               "<|im_start|>assistant\n")
    # The special tokens are single ids (1 and 2), not their characters spelled out by BPE.
    assert ids[:3] == [1, 9690, 198] and ids[-4:] == [1, 520, 9531, 198]
    assert ids.count(1) == 3 and ids.count(2) == 2
    assert tok.convert_ids_to_tokens(ids[:3]) == ["<|im_start|>", "system", "Ċ"]


def test_without_a_system_prompt_the_template_adds_its_own(smollm2_tokenizer: Any, tmp_path: Path) -> None:
    """SmolLM2's template puts its default system turn before a conversation that has none: an empty
    ``task.system_prompt`` still gives the model a system turn."""
    tok = smollm2_tokenizer
    dataset = task(tmp_path, "")
    ids = dataset.prompt_ids(dataset.train_problems()[0], tok)
    assert tok.decode(ids) == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                               f"Face<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
