"""The GRPO-vs-TRL benchmark's pieces that run without TRL or Ray: models, prompts, config, maths, report."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from toolbox.bench._bpe_models import MODELS, build_model, corpus, model_config, train_bpe_tokenizer
from toolbox.bench._grpo_report import ratio_line, rows
from toolbox.bench._grpo_trl import Stopwatch
from toolbox.bench._grpo_vs_trl import (
    BEST_2CPU,
    Workload,
    prompt_rows,
    ratio,
    summarize,
    toolbox_overrides,
    toolbox_summary,
    trl_batching,
    trl_summary,
    window,
    workload,
)
from toolbox.bench.grpo import parse

SIZES = {"prompts": 2, "group": 4, "new_tokens": 64, "lr": 1e-4}


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_model(tmp_path_factory.mktemp("bench"), "small")


def test_bpe_tokenizer_is_byte_level_and_round_trips() -> None:
    tok = train_bpe_tokenizer(corpus(500), vocab_size=300)
    for text in ("12+7=19", "héllo wörld ∑", "  spaced\nlines"):  # bytes never seen in training still encode
        assert tok.decode(tok(text)["input_ids"]) == text
    assert len(tok("12+7=19")["input_ids"]) < len("12+7=19")  # merges learnt from the corpus
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<s>", "</s>")


@pytest.mark.parametrize(("name", "millions"), [("small", 4.07), ("medium", 25.44)])
def test_model_shapes_match_the_issue(name: str, millions: float) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    tok = train_bpe_tokenizer(corpus(), vocab_size=512)  # what build_model trains
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(MODELS[name], tok))
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.vocab_size == len(tok) == 512
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(millions, abs=0.01)


def test_unknown_model_name_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--model: 'large' is not a benchmark model; choose from \['medium', 'small'\]"):
        build_model(tmp_path, "large")


def test_saved_model_loads_with_toolbox_and_prompts_match_its_prompt_source(small_dir: str) -> None:
    from toolbox.data.prompts import PromptSource
    from toolbox.data.tasks import TASKS
    from toolbox.models.loading import load_tokenizer

    out = prompt_rows(small_dir, SIZES, steps=3)
    assert len(out) == 6 and all(set(r) == {"prompt", "answer"} for r in out)
    tok = load_tokenizer(small_dir)
    source = PromptSource(TASKS.build({"name": "digit_add", "max_operand": 99}), tok, seed=0)
    step2 = source.step(2, 2, 4)
    assert [tok(r["prompt"])["input_ids"] for r in out[4:]] == [step2[0].ids, step2[4].ids]
    a, b = (int(x) for x in out[0]["prompt"].rstrip("=").split("+"))
    assert out[0]["answer"] == str(a + b)


def test_toolbox_overrides_validate_into_the_intended_run(small_dir: str) -> None:
    from toolbox.config import load_config

    cfg = load_config([*toolbox_overrides(Workload(small_dir, sizes=SIZES), BEST_2CPU), "learner.torch_threads=1"])
    assert cfg.model.path == small_dir and cfg.model.tiny is None and cfg.reward.spec.name == "weighted_sum"
    assert cfg.rollout.sampling.max_new_tokens == 64 and not cfg.rollout.sampling.stop_at_eos
    assert (cfg.algorithm.prompts_per_step, cfg.algorithm.group_size, cfg.algorithm.kl_coef) == (2, 4, 0.0)
    assert cfg.learner.optim.lr == 1e-4 and cfg.learner.optim.scheduler == "constant"
    # a command-line override goes on top of the best settings (2 threads)
    assert (cfg.learner.num_workers, cfg.learner.strategy, cfg.learner.torch_threads) == (1, "single", 1)
    assert cfg.rollout.num_workers == 1 and cfg.learner.micro_batch_size == 8 and cfg.learner.packing  # all 8 rows
    assert (cfg.rollout.torch_threads, cfg.rollout.steps_per_generation, cfg.rollout.max_staleness) == (1, 4, 7)
    assert cfg.algorithm.tis_cap == 2.0  # type: ignore[attr-defined]  # unset: on, since the batches lag


def test_lora_workload_trains_the_same_adapters_on_both_sides(small_dir: str) -> None:
    from toolbox.bench._grpo_vs_trl import SMOLLM2_LORA, trl_lora
    from toolbox.config import load_config

    sizes = {**SIZES, "lora": SMOLLM2_LORA, "lr": 5e-4}
    cfg = load_config(toolbox_overrides(Workload(small_dir, sizes=sizes), BEST_2CPU))
    lora = cfg.learner.lora
    assert lora is not None and (lora.r, lora.alpha, lora.target_modules, lora.sync) == (16, 32, "all-linear", "adapter")
    theirs = trl_lora(sizes)
    assert (theirs.r, theirs.lora_alpha, theirs.target_modules) == (16, 32, "all-linear")
    assert trl_lora(SIZES) is None and load_config(toolbox_overrides(Workload(small_dir, sizes=SIZES), [])).learner.lora is None


def test_summarize_throughput_and_split() -> None:
    out = summarize([2.0, 2.0], {"generate_s": [1.0, 1.5], "train_s": [0.5, 0.5]}, 8, tokens=1024)
    assert out["completions_per_s"] == 4.0 and out["tokens_per_s"] == 256.0 and out["step_s"] == 2.0
    assert out["generate_s"] == 1.25 and out["reward_s"] == 0.0 and out["other_s"] == pytest.approx(0.25)
    assert "cpu_s" not in out
    with_cpu = summarize([2.0, 2.0], {}, 8, tokens=1024, cpu_s=8.0)
    assert with_cpu["cpu_s"] == 4.0 and with_cpu["completions_per_cpu_s"] == 2.0
    with pytest.raises(ValueError, match="no timed steps"):
        summarize([], {}, 8, 0)


def test_window_is_the_growth_after_warmup() -> None:
    assert window([5.0, 7.0, 12.0], warmup=1) == 7.0 and window([5.0, 7.0, 12.0], warmup=2) == 5.0
    assert window([5.0], warmup=1) is None and window([5.0, 7.0], warmup=0) is None


def test_trl_summary_times_from_the_last_warmup_step_end() -> None:
    raw = {"ends": [10.0, 13.0, 15.0, 19.0], "phases": {"generate_s": [9, 2.0, 1.0, 3.0], "reward_s": [0, 0, 0.5, 0]},
           "tokens": [64] * 8 + [64] * 8 + [60] * 8 + [64] * 8, "peak_pss_mib": 500.0, "cpu": [1, 5, 9, 17]}
    out = trl_summary(raw, warmup=2, completions_per_step=8)
    assert out["step_s"] == 3.0 and out["completions_per_s"] == pytest.approx(16 / 6)
    assert out["tokens_per_s"] == pytest.approx((60 * 8 + 64 * 8) / 6)
    assert out["generate_s"] == 2.0 and out["train_s"] == pytest.approx(((2 - 1.5) + (4 - 3)) / 2)
    assert out["peak_pss_mib"] == 500.0 and out["cpu_s"] == 6.0
    with pytest.raises(ValueError, match="at least one warm-up and one timed step"):
        trl_summary(raw, warmup=0, completions_per_step=8)


def test_toolbox_summary_skips_warmup_and_counts_response_tokens() -> None:
    history = [{"step_time_s": 9.0, "response_len": 64.0, "generate_s": 5.0},
               {"step_time_s": 1.0, "response_len": 64.0, "generate_s": 0.6, "train_s": 0.3, "sync_s": 0.05},
               {"step_time_s": 3.0, "response_len": 32.0, "generate_s": 1.4, "train_s": 0.7, "sync_s": 0.05}]
    out = toolbox_summary(history, warmup=1, rows_per_step=8, step_cpu_s=[3.0, 4.0, 11.0])
    assert out["cpu_s"] == 4.0 and out["completions_per_cpu_s"] == 2.0  # from the end of step 1 to that of step 3
    assert out["completions_per_s"] == 4.0 and out["tokens_per_s"] == (64 * 8 + 32 * 8) / 4
    assert out["generate_s"] == 1.0 and out["other_s"] == pytest.approx(2.0 - 1.0 - 0.5 - 0.05)


def test_ratio_is_of_means_and_report_prints_it() -> None:
    tb = [{"completions_per_s": 3.0, "tokens_per_s": 192.0}, {"completions_per_s": 5.0, "tokens_per_s": 320.0}]
    trl = [{"completions_per_s": 2.0, "tokens_per_s": 128.0}, {"completions_per_s": 2.0, "tokens_per_s": 128.0}]
    assert ratio(tb, trl) == 2.0
    result = {"toolbox": tb, "trl": trl, "ratio": ratio(tb, trl), "ratio_tokens": ratio(tb, trl, "tokens_per_s")}
    assert ratio_line(result) == "ratio 2.00 (tokens/s 2.00)"
    assert ratio_line({**result, "ratio_cpu": 1.5}) == "ratio 2.00 (tokens/s 2.00, per CPU s 1.50)"
    cells = rows(result)
    assert [c[:3] for c in cells] == [["trl", "0", "2.00"], ["trl", "1", "2.00"], ["toolbox", "0", "3.00"],
                                      ["toolbox", "1", "5.00"]]
    assert cells[0][-1] == "-"  # no start-up figure for TRL


def test_stopwatch_sums_wrapped_calls_per_step() -> None:
    watch = Stopwatch()
    calls = watch.wrap("reward_s", lambda x: x + 1)
    assert calls(1) == 2 and calls.__name__ == "<lambda>"
    watch.step_end()
    watch.step_end()
    assert len(watch.ends) == 2 and watch.spent["generate_s"] == [0.0, 0.0]
    assert watch.spent["reward_s"][0] > 0 and watch.spent["reward_s"][1] == 0.0


def test_cli_defaults_per_mode() -> None:
    vs = parse(["--vs", "trl", "--model", "small"])
    assert (vs.steps, vs.warmup, vs.rounds, vs.new_tokens) == (8, 2, 2, 64)
    plain = parse(["rollout.num_workers=1"])
    assert (plain.vs, plain.steps, plain.warmup, plain.overrides) == (None, 30, 3, ["rollout.num_workers=1"])
    with pytest.raises(SystemExit):
        parse(["--vs", "trl", "--warmup", "0"])


def test_cli_takes_smollm2_and_its_path_only_with_it(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["--vs", "trl", "--model", "smollm2", "--model-path", "/m", "--report", "r.md", "--steps", "6"])
    assert (args.model, args.model_path, args.report, args.steps) == ("smollm2", "/m", "r.md", 6)
    assert parse(["--vs", "trl"]).model == "both" and parse(["--vs", "trl"]).model_path == ""
    with pytest.raises(SystemExit):
        parse(["--vs", "trl", "--model", "small", "--model-path", "/m"])
    assert "--model-path goes with --model smollm2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--vs", "trl", "--model", "smollm3"])
    assert "invalid choice: 'smollm3'" in capsys.readouterr().err


def test_smollm2_workload_is_the_chat_arithmetic_run_with_micro_batch_4(small_dir: str, tmp_path: Path) -> None:
    from toolbox.config import load_config

    work = workload("smollm2", str(tmp_path), 64, model_path=small_dir)  # any model directory stands in for it
    assert work.model_dir == small_dir and work.task["name"] == "dataset" and work.task["path"].endswith("data/arith")
    assert work.task["system_prompt"] and work.reward["components"][0]["name"] == "math_verify"
    assert (work.sizes["prompts"], work.sizes["group"], work.sizes["micro_batch"], work.sizes["lr"]) == (2, 4, 4, 1e-5)
    cfg = load_config(toolbox_overrides(work, BEST_2CPU))
    assert cfg.learner.micro_batch_size == 4 and cfg.model.dtype == "float32" and cfg.learner.lora is None
    assert cfg.task.name == "dataset" and cfg.task.system_prompt == work.task["system_prompt"]  # type: ignore[union-attr]
    assert trl_batching(work.sizes) == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}
    assert trl_batching(SIZES) == {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}
    with pytest.raises(ValueError, match="micro-batch 3 must divide the 8 rows of a step"):
        trl_batching({**SIZES, "micro_batch": 3})


def test_smollm2_directory_comes_from_the_flag_the_env_or_the_catalog(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from toolbox.bench import _smollm2

    (tmp_path / "given").mkdir()
    (tmp_path / "given" / "config.json").write_text("{}")
    monkeypatch.delenv(_smollm2.PATH_ENV, raising=False)
    assert _smollm2.model_dir(str(tmp_path / "given")) == str(tmp_path / "given")
    with pytest.raises(SystemExit, match=r"--model-path / \$TOOLBOX_BENCH_SMOLLM2: .*nowhere is not a model directory"):
        _smollm2.model_dir(str(tmp_path / "nowhere"))
    monkeypatch.setenv(_smollm2.PATH_ENV, str(tmp_path / "given"))
    assert _smollm2.model_dir() == str(tmp_path / "given")
    monkeypatch.delenv(_smollm2.PATH_ENV)
    if _smollm2._catalog() is None:
        pytest.skip("no toolbox.models.catalog in this checkout")
    monkeypatch.setenv("TOOLBOX_MODEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit, match=r"bench --model smollm2: .*run `toolbox model fetch smollm2-135m-instruct`"):
        _smollm2.model_dir()
    (tmp_path / "cache" / _smollm2.NAME).mkdir(parents=True)
    (tmp_path / "cache" / _smollm2.NAME / "config.json").write_text("{}")
    assert _smollm2.model_dir() == str(tmp_path / "cache" / _smollm2.NAME)


def test_trl_config_matches_the_toolbox_run(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from toolbox.bench._grpo_trl import trl_config

    cfg = trl_config(str(tmp_path), SIZES, steps=5)
    assert cfg.per_device_train_batch_size == 8 and cfg.num_generations == 4 and cfg.max_steps == 5
    assert cfg.max_completion_length == 64 and cfg.generation_kwargs == {"min_new_tokens": 64}
    assert cfg.beta == 0.0 and cfg.use_cpu and not cfg.bf16 and not cfg.gradient_checkpointing  # TRL: on by default
    assert cfg.learning_rate == 1e-4 and not cfg.shuffle_dataset and math.isclose(cfg.max_grad_norm, 1.0)
    assert cfg.steps_per_generation == 1  # one optimizer step per generation batch
    micro = trl_config(str(tmp_path), SIZES, steps=5, **trl_batching({**SIZES, "micro_batch": 4}))
    assert (micro.per_device_train_batch_size, micro.gradient_accumulation_steps) == (4, 2)
    assert micro.generation_batch_size == 8  # still one generation of 2 prompts x 4 per optimizer step
