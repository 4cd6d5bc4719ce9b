"""The `dataset` prompt task and offline records from every source kind: formats, bad rows, epochs, a short run."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.unit.golden import run_recipe
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.data.dataset_task import DatasetTask, DatasetTaskConfig
from toolbox.data.encode import encode_preference
from toolbox.data.offline import load_records
from toolbox.data.prompts import PromptSource
from toolbox.data.rows import DataConfig
from toolbox.driver.preflight import resolve_model_path
from toolbox.models.tiny import build_char_tokenizer

ROWS = [{"question": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(12)]
FORMATS = ["jsonl", "json", "parquet", "csv", "disk"]


def write(rows: list[dict[str, Any]], path: Path, fmt: str) -> Path:
    """``rows`` saved as ``fmt`` (``disk``: a ``save_to_disk`` directory) under ``path``'s directory."""
    import datasets

    target = path.with_suffix("" if fmt == "disk" else f".{fmt}")
    if fmt == "jsonl":
        target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        target.write_text(json.dumps(rows))
    else:
        table = datasets.Dataset.from_list(rows)
        {"parquet": table.to_parquet, "csv": lambda p: table.to_csv(p, index=False),
         "disk": table.save_to_disk}[fmt](str(target))
    return target


def task(path: Path, **options: Any) -> DatasetTask:
    """The ``dataset`` task over ``path`` (question/answer columns), bad rows an error."""
    return DatasetTask(DatasetTaskConfig(path=str(path), prompt_field="question", answer_field="answer", **options))


# ---- the prompt task --------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_prompt_task_reads_every_format(tmp_path: Path, fmt: str) -> None:
    t = task(write(ROWS, tmp_path / "d", fmt), template="Q: {prompt}\nA:", eval_fraction=0.25)
    assert len(t.train_problems()) == 9 and len(t.eval_problems()) == 3
    assert {p.prompt for p in (*t.train_problems(), *t.eval_problems())} == {f"Q: {r['question']}\nA:" for r in ROWS}
    assert {p.answer for p in t.eval_problems()} <= {r["answer"] for r in ROWS}
    assert set("Q:\nWhatisplu?0123456789") <= set(t.alphabet())


def test_eval_split_of_a_saved_dataset_dict(tmp_path: Path) -> None:
    import datasets

    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:8]),
                                   "test": datasets.Dataset.from_list(ROWS[8:])})
    splits.save_to_disk(str(tmp_path / "dd"))
    t = task(tmp_path / "dd", eval_split="test")
    assert [p.answer for p in t.eval_problems()] == [r["answer"] for r in ROWS[8:]]
    with pytest.raises(ConfigError, match=r"no split 'dev'; splits: \['test', 'train'\]"):
        task(tmp_path / "dd", eval_split="dev")


def test_config_rejects_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        DatasetTaskConfig(path="x.jsonl", eval_split="test", eval_fraction=0.1)
    with pytest.raises(ValueError, match="has no {prompt} field"):
        DatasetTaskConfig(path="x.jsonl", template="Question:")
    with pytest.raises(ConfigError, match="unknown file type '.xml'"):  # (.txt is raw-text documents)
        task(write(ROWS, tmp_path / "d", "jsonl").rename(tmp_path / "d.xml"))


def test_epochs_are_deterministic_and_resume_continues(tmp_path: Path) -> None:
    t, tok = task(write(ROWS, tmp_path / "d", "jsonl")), build_char_tokenizer("".join(r["question"] for r in ROWS))
    fresh = PromptSource(t, tok, seed=3)
    answers = [[r.extras["answer"] for r in fresh.step(k, 4, 2)[::2]] for k in range(6)]
    assert sorted(sum(answers[:3], [])) == sorted(r["answer"] for r in ROWS)  # epoch 1: every prompt once
    assert sorted(sum(answers[3:], [])) == sorted(r["answer"] for r in ROWS)  # epoch 2: again, reshuffled
    assert sum(answers[:3], []) != sum(answers[3:], [])
    resumed = PromptSource(task(tmp_path / "d.jsonl"), tok, seed=3)  # a new process resuming at step 4
    assert [[r.extras["answer"] for r in resumed.step(k, 4, 2)[::2]] for k in (4, 5)] == answers[4:]
    assert [r.ids for r in resumed.step(4, 4, 2)] == [r.ids for r in fresh.step(4, 4, 2)]


def test_eval_set_uses_held_out_prompts(tmp_path: Path) -> None:
    t = task(write(ROWS, tmp_path / "d", "jsonl"), eval_fraction=0.25)
    source = PromptSource(t, build_char_tokenizer(t.alphabet()), seed=0)
    held = {p.answer for p in t.eval_problems()}
    assert [r.extras["answer"] for r in source.eval_set(100)] == [p.answer for p in t.eval_problems()]
    trained = {r.extras["answer"] for k in range(3) for r in source.step(k, 3, 1)}
    assert trained.isdisjoint(held)


def test_chat_template_and_system_prompt(tmp_path: Path) -> None:
    t = task(write(ROWS, tmp_path / "d", "jsonl"), system_prompt="Be brief.")
    tok = build_char_tokenizer(t.alphabet() + "<>|su:a")
    plain = tok.decode(PromptSource(t, tok, 0).eval_set(1)[0].ids, skip_special_tokens=True)
    assert plain == f"Be brief.\n{ROWS[0]['question']}"
    tok.chat_template = "{% for m in messages %}<|{{ m.role[0] }}:{{ m.content }}|>{% endfor %}{% if add_generation_prompt %}a:{% endif %}"
    chat = tok.decode(PromptSource(t, tok, 0).eval_set(1)[0].ids, skip_special_tokens=True)
    assert chat == f"<|s:Be brief.|><|u:{ROWS[0]['question']}|>a:"


def test_too_long_prompts_are_bad_rows_never_cut(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rows = [*ROWS[:3], {"question": "x" * 40, "answer": "1"}]
    path = write(rows, tmp_path / "d", "jsonl")
    tok = build_char_tokenizer("".join(r["question"] for r in rows))
    tok.model_max_length = 30
    with pytest.raises(ConfigError, match=rf"{path}:4: prompt is 40 tokens, longer than the model's limit of 30"):
        PromptSource(task(path), tok, 0)
    skipping = DatasetTask(DatasetTaskConfig(path=str(path), prompt_field="question"), DataConfig(on_bad_row="skip"))
    with caplog.at_level(logging.WARNING):
        PromptSource(skipping, tok, 0)
    assert len(skipping.train_problems()) == 3 and "skipped 1 of 4 rows" in caplog.text


# ---- malformed rows ---------------------------------------------------------------------------
BAD_PROMPT_ROWS = [{"question": "ok?", "answer": "1"}, {"answer": "2"}, {"question": 5, "answer": "3"},
                   {"question": "  ", "answer": "4"}, {"question": "ok?", "answer": [1]}]


def test_bad_prompt_rows_error_lists_them_all(tmp_path: Path) -> None:
    path = write(BAD_PROMPT_ROWS, tmp_path / "bad", "jsonl")
    with pytest.raises(ConfigError) as info:
        task(path)
    message = str(info.value)
    assert "4 of 5 rows are malformed" in message
    assert f"{path}:2: field 'question' is missing (set task.prompt_field)" in message
    assert f"{path}:3: field 'question' must be a string, got int" in message
    assert f"{path}:4: field 'question' is empty" in message
    assert f"{path}:5: field 'answer' must be a string or a number, got list" in message


def test_bad_rows_skipped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(BAD_PROMPT_ROWS, tmp_path / "bad", "jsonl")
    with caplog.at_level(logging.WARNING):
        t = DatasetTask(DatasetTaskConfig(path=str(path), prompt_field="question"), DataConfig(on_bad_row="skip"))
    assert [p.answer for p in t.train_problems()] == ["1"]
    assert f"skipped 4 of 5 rows of {path} (data.on_bad_row=skip); first: {path}:2:" in caplog.text


def test_error_lists_at_most_twenty(tmp_path: Path) -> None:
    path = write([{"question": ""}] * 25 + [ROWS[0]], tmp_path / "many", "jsonl")
    message = str(pytest.raises(ConfigError, task, path).value)
    assert "25 of 26 rows are malformed" in message and "... and 5 more" in message
    assert f"{path}:20:" in message and f"{path}:21:" not in message


def test_data_section_reaches_config_check(tmp_path: Path) -> None:
    path = write(BAD_PROMPT_ROWS, tmp_path / "bad", "jsonl")
    base = ["experiment=grpo_tiny", "task.name=dataset", f"task.path={path}", "task.prompt_field=question"]
    with pytest.raises(ConfigError, match=r"task.path: 4 of 5 rows are malformed"):
        load_config(base)
    assert load_config([*base, "data.on_bad_row=skip"]).data.on_bad_row == "skip"
    with pytest.raises(ConfigError, match=r"data.on_bad_row: Input should be 'error' or 'skip'"):
        load_config([*base, "data.on_bad_row=ignore"])


# ---- offline records (SFT / DPO) ----------------------------------------------------------------
SFT_ROWS: list[dict[str, Any]] = [
    {"prompt": "1+1=", "response": "2"},
    {"prompt": "1+2=", "completion": "3"},
    {"messages": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]},
    {"prompt": [{"role": "user", "content": "2+3="}], "completion": [{"role": "assistant", "content": "5"}]},
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("kind", "rows"), [
    ("sft", [{"prompt": "1+1=", "completion": "2"}, {"prompt": "1+2=", "completion": "3"}]),
    ("sft", [{"messages": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]}]),
    ("preference", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}]),
    ("preference", [{"prompt": "1+1=", "chosen": [{"role": "assistant", "content": "2"}],
                     "rejected": [{"role": "assistant", "content": "3"}]}]),
])
def test_records_from_every_format(tmp_path: Path, fmt: str, kind: str, rows: list[dict[str, Any]]) -> None:
    if fmt == "csv" and any(isinstance(v, list) for r in rows for v in r.values()):
        pytest.skip("CSV holds no lists")
    records = load_records(write(rows, tmp_path / "r", fmt), kind)  # type: ignore[arg-type]
    assert len(records) == len(rows)
    assert set(records[0]) in ({"prompt", "response"}, {"messages"}, {"prompt", "chosen", "rejected"},
                               {"messages", "chosen", "rejected"})


def test_conversational_shapes_normalise(tmp_path: Path) -> None:
    records = load_records(write(SFT_ROWS, tmp_path / "s", "jsonl"), "sft")
    assert records[1] == {"prompt": "1+2=", "response": "3"}
    assert records[3] == {"messages": [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]}
    full = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]
    pref = load_records(write([{"chosen": full, "rejected": [full[0], {"role": "assistant", "content": "3"}]}],
                              tmp_path / "p", "jsonl"), "preference")
    assert pref == [{"messages": full[:1], "chosen": "2", "rejected": "3"}]


def test_message_preferences_encode_through_the_chat_template() -> None:
    tok = build_char_tokenizer("0123456789+=<>|ua:")
    tok.chat_template = "{% for m in messages %}<|{{ m.role[0] }}:{{ m.content }}|>{% endfor %}{% if add_generation_prompt %}a:{% endif %}"
    chosen, rejected = encode_preference({"messages": [{"role": "user", "content": "1+1="}], "chosen": "2",
                                          "rejected": "3"}, tok, 64)
    assert tok.decode(chosen.input_ids) == "<|u:1+1=|><|a:2|>"
    assert tok.decode([t for t, m in zip(rejected.input_ids, rejected.loss_mask) if m]).endswith("3|>")


@pytest.mark.parametrize(("row", "kind", "what"), [
    ({"prompt": "", "response": "2"}, "sft", "field 'prompt' is empty"),
    ({"prompt": "1+1=", "completion": " "}, "sft", "field 'completion' is empty"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "sft", "no 'assistant' turn"),
    ({"prompt": "1+1=", "chosen": [{"role": "user", "content": "2"}], "rejected": "3"}, "preference",
     "chosen must end with a non-empty 'assistant' turn"),
    ({"chosen": [{"role": "assistant", "content": "2"}], "rejected": [{"role": "assistant", "content": "3"}]},
     "preference", "no prompt"),
])
def test_bad_record_rows(tmp_path: Path, row: dict[str, Any], kind: str, what: str) -> None:
    good = {"prompt": "1+1=", "response": "2", "chosen": "2", "rejected": "3"}
    path = write([good, row], tmp_path / "bad", "jsonl")
    with pytest.raises(ConfigError, match=rf"{path}:2: .*{what}"):
        load_records(path, kind)  # type: ignore[arg-type]
    assert len(load_records(path, kind, on_bad_row="skip")) == 1  # type: ignore[arg-type]


def test_offline_config_check_uses_data_section(tmp_path: Path) -> None:
    path = write([{"prompt": "1+1=", "response": "2"}, {"prompt": "1+2="}], tmp_path / "s", "parquet")
    with pytest.raises(ConfigError, match=rf"algorithm.dataset: {path}:2: field 'response' is missing"):
        load_config(["experiment=sft_tiny", f"algorithm.dataset={path}"])
    cfg = load_config(["experiment=sft_tiny", f"algorithm.dataset={path}", "data.on_bad_row=skip"])
    assert cfg.algorithm.data.on_bad_row == "skip"  # type: ignore[attr-defined] - travels to the learner ranks


# ---- the whole path -----------------------------------------------------------------------------
def dataset_overrides(path: Path) -> list[str]:
    return ["experiment=grpo_tiny", "task.name=dataset", f"task.path={path}", "task.prompt_field=question",
            "task.answer_field=answer", "task.eval_fraction=0.25", "model.tiny.max_positions=64"]


def test_grpo_tiny_over_a_dataset_builds_a_covering_tokenizer(tmp_path: Path) -> None:
    path = write(ROWS, tmp_path / "d", "csv")
    cfg = load_config(dataset_overrides(path))
    assert cfg.task.model_dump().keys() >= {"path", "prompt_field"} and "max_operand" not in cfg.task.model_dump()
    from toolbox.models.loading import load_tokenizer

    tok = load_tokenizer(resolve_model_path(cfg, tmp_path))
    assert set("".join(r["question"] + r["answer"] for r in ROWS)) <= set(tok.get_vocab())


def test_short_grpo_run_on_a_dataset(tmp_path: Path) -> None:
    path = write(ROWS, tmp_path / "d", "parquet")
    history = run_recipe(tmp_path, *dataset_overrides(path), "trainer.total_steps=2", "reward.spec.name=exact_match")
    assert len(history) == 2 and all("reward" in m for m in history)

