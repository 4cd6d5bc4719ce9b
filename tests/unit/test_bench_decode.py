"""`python -m toolbox.bench decode`'s harness on a small case: every path runs, alternating, and samples the same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolbox.bench.decode import PATHS, Case, main, run_case


def test_every_path_samples_the_same_tokens_and_is_timed(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "tiny").symlink_to(tiny_model_dir)  # the session's tiny model, not a new one
    result = run_case("tiny_eos", Case("tiny", prompts=4, samples=2, max_new_tokens=5, eos_bias=2.0), tmp_path,
                      rounds=2, repeats=1)
    assert result["same_tokens"] is True and result["rows"] == 8 and result["tokens_per_call"] > 8
    for path in PATHS:
        assert len(result[f"{path}_rounds_s"]) == 2 and result[f"{path}_s"] > 0
        assert result[f"{path}_speedup"] == pytest.approx(result["generate_s"] / result[f"{path}_s"])


def test_unknown_case_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--cases", "small,huge"])
    assert "--cases: unknown ['huge']" in capsys.readouterr().err


def test_smollm2_choice_parses_with_its_own_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from toolbox.bench.decode import parse

    args = parse(["--model", "smollm2", "--report", "r.md"])
    assert (args.batches, args.bf16_batches, args.new_tokens, args.repeats, args.train_rows) == ([1, 32], [1], 64, 2, 4)
    assert args.dtypes == ["fp32", "bf16", "bf16t"]
    assert parse([]).model == "cases" and parse([]).repeats == 3
    with pytest.raises(SystemExit):
        parse(["--model", "smollm2", "--dtypes", "fp16"])
    assert "--dtypes: ['fp16'] must name some of fp32, bf16, bf16t" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--model", "smollm2", "--batches", "1,x"])
    assert "--batches: '1,x' is not a comma-separated list of integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--model", "smollm2", "--new-tokens", "1"])
    assert "--new-tokens at least 2" in capsys.readouterr().err


def test_bound_counts_weights_once_and_kv_per_cached_position() -> None:
    from toolbox.bench._decode_bound import TrafficModel, mean_context

    traffic = TrafficModel(weight_bytes=1000, kv_bytes_per_position=10)
    assert traffic.step_bytes(batch=1, context=50) == 1500 and traffic.step_bytes(batch=4, context=50) == 3000
    # 4 tokens a step, a step takes 3000 bytes / 6000 bytes/s = 0.5 s
    assert traffic.bound_tokens_per_s(batch=4, context=50, bytes_per_s=6000) == 8.0
    assert mean_context(prompt_len=40, new_tokens=64) == 72.0  # decode steps 1..63 attend to 41..103 positions


def test_traffic_model_of_smollm2_shapes() -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from toolbox.bench._decode_bound import traffic_model

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    traffic = traffic_model(model)
    assert traffic.weight_bytes == 134_515_008 * 4  # the tied embedding once
    assert traffic.kv_bytes_per_position == 2 * 30 * 3 * 64 * 4
    half = traffic_model(model.to(torch.bfloat16))
    assert half.weight_bytes == traffic.weight_bytes // 2
    assert half.kv_bytes_per_position == traffic.kv_bytes_per_position // 2


def test_precision_rows_compare_each_role_and_name_the_faster() -> None:
    from toolbox.bench._decode_bound import ratio_rows, tables

    decode = [{"dtype": d, "batch": b, "prompt_len": 46, "call_s": s, "prefill_s": 0.1, "decode_tokens_per_s": 10.0,
               "bound_tokens_per_s": 20.0, "fraction": 0.5}
              for d, b, s in (("fp32", 1, 2.0), ("fp32", 32, 8.0), ("bf16", 1, 3.0), ("bf16t", 1, 1.0))]
    result = {"decode": decode, "train_s": {"fp32": 4.0, "bf16": 10.0}, "new_tokens": 64, "train_rows": 4,
              "memcpy_gb_per_s": 12.0}
    rows = ratio_rows(result)
    assert [r[1:] for r in rows] == [["bf16", "2.000", "3.000", "1.50", "fp32"],
                                     ["bf16t", "2.000", "1.000", "0.50", "bf16t"],
                                     ["bf16", "4.000", "10.000", "2.50", "fp32"]]
    assert rows[0][0] == "generation, batch 1 x 64 tokens (s a call)"  # no bf16 row at batch 32: no pair there
    assert rows[2][0] == "training, 4 rows forward + backward (s)"
    shown = tables(result, threads=1)
    assert "memcpy 12.0 GB/s" in shown[0].title and shown[0].rows[0][-1] == "50%" and len(shown[0].rows) == 4


def test_memcpy_bandwidth_is_positive() -> None:
    from toolbox.bench._decode_bound import memcpy_bytes_per_s

    assert memcpy_bytes_per_s(mib=4, repeats=1) > 1e6
