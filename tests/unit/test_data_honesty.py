"""Data honesty: rows cut to max_length are counted (or refused), unknown characters and pairs made identical by
cutting are bad rows, and every bad row of a file is listed in one error. A char tokenizer, no model, no Ray."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.data.offline import load_records
from toolbox.data.rows import DataConfig
from toolbox.models.tiny import build_char_tokenizer

TOK = build_char_tokenizer("0123456789+= ")


def jsonl(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def dpo_config(path: Path, *overrides: str):  # noqa: ANN201 - the DPO config class
    return load_config(["experiment=dpo_tiny", f"algorithm.dataset={path}", "algorithm.max_length=12", *overrides])


def test_every_bad_row_of_a_file_in_one_error(tmp_path: Path) -> None:
    path = jsonl(tmp_path, [
        {"prompt": "1+2=", "chosen": "3", "rejected": "4"},            # 1: fine
        {"prompt": "1+2=", "chosen": "3", "rejected": "three"},        # 2: letters a digit tokenizer cannot encode
        {"prompt": "  ", "chosen": "3", "rejected": "4"},              # 3: empty prompt
        {"prompt": "1+1=", "chosen": "22222222229", "rejected": "22222222228"},  # 4: identical once cut to 12
        {"prompt": "1+1=", "chosen": "", "rejected": "4"},             # 5: empty answer
    ])
    cfg = dpo_config(path, "data.on_bad_row=skip")  # reading without the tokenizer: rows 3 and 5 only
    with pytest.raises(ConfigError) as info:
        cfg.algorithm.check_rows(DataConfig(), TOK)
    msg = str(info.value)
    assert msg.startswith("algorithm.dataset: 4 of 5 rows are malformed (data.on_bad_row=skip drops bad rows):\n")
    assert (f"{path}:2: field 'rejected' has characters the tokenizer cannot encode: 'ehrt' (they would become its "
            "unknown token") in msg
    assert f"{path}:3: field 'prompt' is empty" in msg and f"{path}:5: field 'chosen' is empty" in msg
    assert (f"{path}:4: chosen and rejected are identical once cut to max_length=12 tokens, so the pair teaches "
            "nothing") in msg
    assert f"{path}:1:" not in msg


def test_cut_rows_are_counted_at_start_or_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    long = {"prompt": "1+1=", "response": "2" * 20}
    path = jsonl(tmp_path, [{"prompt": "1+1=", "response": "2"}, long, long])
    cfg = load_config(["experiment=sft_tiny", f"algorithm.dataset={path}", "algorithm.max_length=12"])
    with caplog.at_level(logging.WARNING):
        cfg.algorithm.check_rows(cfg.data, TOK)
    assert (f"data: 2 of 3 records of {path} are longer than algorithm.max_length and are cut at the end (rows 2, 3); "
            "data.on_overflow=error refuses them") in caplog.text
    with pytest.raises(ConfigError, match=rf"2 of 3 rows are malformed.*\n  {path}:2: 25 tokens, longer than "
                                          r"algorithm.max_length=12 \(data.on_overflow=error; 'warn' cuts it\)\n  "
                                          rf"{path}:3: "):
        cfg.algorithm.check_rows(DataConfig(on_overflow="error"), TOK)


def test_records_that_fit_pass_silently(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = jsonl(tmp_path, [{"prompt": "1+1=", "response": "2"}, {"prompt": "2+2=", "response": "4"}])
    with caplog.at_level(logging.WARNING):
        records = load_records(path, "sft", fits=load_config(["experiment=sft_tiny"]).algorithm.fits(TOK))
    assert len(records) == 2 and "data:" not in caplog.text
