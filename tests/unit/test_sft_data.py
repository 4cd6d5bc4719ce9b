"""SFT data: record validation (errors name file:row), loss masks, chat templates, packing with document-bounded attention."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from toolbox.core.errors import ConfigError
from toolbox.data.encode import Example, encode_messages, encode_sft
from toolbox.data.offline import RecordSource, load_jsonl, wrong_answer
from toolbox.data.packing import check_packing, pack_examples, pad_examples
from toolbox.data.tasks import TASKS, Problem
from toolbox.models.tiny import build_char_tokenizer

TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }};{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")


@pytest.fixture(scope="module")
def tok():  # noqa: ANN201 - transformers type
    return build_char_tokenizer("0123456789+=")


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


# ---- records ------------------------------------------------------------------------------------
def test_jsonl_loads_both_sft_shapes(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"prompt": "1+1=", "response": "2"}), "",
                                              json.dumps({"messages": [{"role": "user", "content": "1+2="},
                                                                       {"role": "assistant", "content": "3"}]})])
    assert len(load_jsonl(path, "sft")) == 2


@pytest.mark.parametrize(("line", "kind", "what"), [
    ('{"prompt": "1+1=", "response": 2}', "sft", "field 'response' must be a string"),
    ('{"prompt": "1+1="', "sft", "not valid JSON"),
    ('["prompt"]', "sft", "must be a JSON object"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "sft", "no 'assistant' turn"),
    ('{"messages": [{"role": "bot", "content": "hi"}]}', "sft", "messages[0]"),
    ('{"prompt": "1+1=", "chosen": "2"}', "preference", "field 'rejected'"),
])
def test_bad_row_names_file_and_row(tmp_path: Path, line: str, kind: str, what: str) -> None:
    good = json.dumps({"prompt": "1+1=", "response": "2", "chosen": "2", "rejected": "3"})
    path = write_jsonl(tmp_path / "bad.jsonl", [good, good, line])
    with pytest.raises(ConfigError) as info:
        load_jsonl(path, kind)  # type: ignore[arg-type]
    assert f"{path}:3:" in str(info.value) and what in str(info.value)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_jsonl(tmp_path / "nope.jsonl", "sft")
    with pytest.raises(ConfigError, match="no records"):
        load_jsonl(write_jsonl(tmp_path / "empty.jsonl", [""]), "sft")


def test_record_source_is_deterministic_and_epoch_shuffled() -> None:
    records = [{"prompt": str(i), "response": "x"} for i in range(10)]
    a, b = RecordSource("sft", 3, records=records), RecordSource("sft", 3, records=records)
    first_epoch = [r["prompt"] for s in range(5) for r in a.step(s, 2)]
    assert sorted(first_epoch) == sorted(r["prompt"] for r in records)  # every record once per epoch
    assert [r["prompt"] for r in b.step(4, 2)] == first_epoch[8:]  # any step, any order of calls
    task = TASKS.build({"name": "digit_add"})
    assert RecordSource("sft", 0, task=task).step(7, 4) == RecordSource("sft", 0, task=task).step(7, 4)


def test_wrong_answer_is_wrong() -> None:
    rng = random.Random(0)
    for answer in ["0", "1", "7", "12", "abca"]:
        for _ in range(20):
            assert wrong_answer(Problem("p", answer), rng, "abcd0123456789") != answer


# ---- encoding -----------------------------------------------------------------------------------
def test_prompt_tokens_are_masked_and_eos_is_a_target(tok) -> None:  # noqa: ANN001
    ex = encode_sft({"prompt": "3+4=", "response": "7"}, tok, max_length=64)
    assert tok.decode(ex.input_ids[:-1]) == "3+4=7" and ex.input_ids[-1] == tok.eos_token_id
    assert ex.loss_mask == [0, 0, 0, 0, 1, 1]
    assert encode_sft({"prompt": "3+4=", "response": "7"}, tok, max_length=5).loss_mask == [0, 0, 0, 0, 1]


def test_chat_template_masks_every_assistant_turn() -> None:
    tok = build_char_tokenizer("0123456789+=uas:;")
    tok.chat_template = TEMPLATE
    msgs = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
            {"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]
    ex = encode_messages(msgs, tok)
    text = tok.decode(ex.input_ids)
    assert text == "u:1+1=;a:2;u:2+2=;a:4;"
    targets = "".join(c for c, m in zip(text, ex.loss_mask) if m)
    assert targets == "2;4;"  # the assistant's content and its end-of-turn marker, nothing of the prompts
    pair = encode_sft({"prompt": "1+1=", "response": "2"}, tok, 64)
    assert tok.decode(pair.input_ids) == "u:1+1=;a:2;"
    plain = encode_sft({"prompt": "1+1=", "response": "2"}, tok, 64, use_chat_template=False)
    assert tok.decode(plain.input_ids[:-1]) == "1+1=2"


def test_messages_without_a_template_fail(tok) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="chat template"):
        encode_sft({"messages": [{"role": "assistant", "content": "1"}]}, tok, 64)


# ---- packing ------------------------------------------------------------------------------------
DOCS = [Example([1, 5, 6, 7], [0, 0, 1, 1]), Example([1, 8, 9], [0, 1, 1]), Example([1, 3, 3, 3, 3, 3], [0, 0, 1, 1, 1, 1]),
        Example([4, 4], [0, 1])]


def test_pack_layout_restarts_positions_per_document() -> None:
    batch = pack_examples(DOCS, row_length=8, pad_id=0)
    assert batch.packed and batch.attention_mask_BT is None
    assert batch.input_ids_BT.tolist() == [[1, 5, 6, 7, 1, 8, 9, 0], [1, 3, 3, 3, 3, 3, 4, 4]]
    assert batch.position_ids_BT.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5, 0, 1]]
    assert batch.doc_ids_BT.tolist() == [[1, 1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 2, 2]]
    assert batch.documents() == 4
    padded = pad_examples(DOCS, pad_id=0)
    assert len(padded) == 4 and padded.attention_mask_BT.tolist()[3] == [1, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_unpacked_logits_per_document(tiny_model_dir: Path, attn: str) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn).eval()
    packed, alone = pack_examples(DOCS, 8, 0), pad_examples(DOCS, 0)
    with torch.no_grad():
        lp = model(**packed.model_inputs()).logits
        lu = model(**alone.model_inputs()).logits
    spans = [(0, 0, 4, 0), (0, 4, 3, 1), (1, 0, 6, 2), (1, 6, 2, 3)]  # (row, start, length, doc)
    for row, start, n, doc in spans:
        torch.testing.assert_close(lp[row, start : start + n], lu[doc, :n], atol=1e-5, rtol=1e-5)
    # Sanity: without restarted positions the second document does see the first, and its logits move.
    leaky = model(input_ids=packed.input_ids_BT[:1], use_cache=False).logits
    assert (leaky[0, 4:7] - lu[1, :3]).abs().max() > 1e-3
    check_packing(model, vocab_size=15)


def test_check_packing_rejects_a_model_that_leaks_across_documents(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)

    class IgnoresPositions(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids, **_):  # noqa: ANN001, ANN003, ANN202
            return self.inner(input_ids=input_ids, use_cache=False)

    with pytest.raises(RuntimeError, match="packing=false"):
        check_packing(IgnoresPositions(), vocab_size=15)
