"""Throughput metrics: token counts of a step, tokens per second per role, the learner's MFU, their summary."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolbox.config import load_config
from toolbox.driver.experiment import ExperimentBuilder
from toolbox.learner.throughput import model_dims, peak_flops, step_rates, train_flops


def test_rates_divide_each_roles_count_by_its_time() -> None:
    metrics = {"sampled_tokens": 600.0, "generate_s": 2.0, "train_tokens": 900.0, "train_s": 3.0, "samples": 8.0,
               "reward_s": 0.5}
    assert step_rates(metrics) == {"rollout_tokens_per_s": 300.0, "learner_tokens_per_s": 300.0,
                                   "reward_samples_per_s": 16.0}
    assert step_rates({"sampled_tokens": 5.0}) == {}


def test_flops_are_six_n_per_token_plus_attention() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    params, layers, width = model_dims(model)
    assert params == sum(p.numel() for p in model.parameters()) and (layers, width) == (2, 32)
    wrapped = torch.nn.Module()
    wrapped.module = model  # as DistributedDataParallel holds it
    assert model_dims(wrapped) == (params, 2, 32)
    embed = model.get_input_embeddings().weight
    embed.requires_grad_(False)  # frozen (as LoRA's base weights are): 4 FLOPs per token of 6, no weight gradient
    assert model_dims(model)[0] == pytest.approx(params - embed.numel() / 3)
    assert train_flops((params, layers, width), tokens=10, mean_len=5) == 10 * (6 * params + 12 * 2 * 32 * 5)


def test_the_peak_is_the_users_figure_else_a_known_gpus() -> None:
    assert peak_flops("cpu", 2.5) == 2.5e12
    assert peak_flops("cpu") is None  # no figure for a CPU: no mfu metric
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        assert (peak_flops("cuda") is not None) == any(k in name for k in ("A100", "H100", "H200", "L4", "A10"))


def test_a_grpo_run_reports_throughput_and_mfu(tmp_path: Path) -> None:
    args = ["experiment=grpo_tiny", "ray.local_mode=true", "callbacks=[]", "trainer.eval_every=0",
            "trainer.final_eval=false", f"trainer.run_root={tmp_path}", "trainer.total_steps=3",
            "rollout.max_staleness=0", "rollout.steps_per_generation=1", "learner.peak_tflops=0.001"]
    trainer = ExperimentBuilder(load_config(args)).build_trainer()
    summary = trainer.fit()
    for m in trainer.history:
        assert m["sampled_tokens"] > 0 and m["train_tokens"] > m["sampled_tokens"]  # prompts are trained on too
        assert m["learner_tokens_per_s"] == pytest.approx(m["train_tokens"] / m["train_s"])
        assert m["rollout_tokens_per_s"] == pytest.approx(m["sampled_tokens"] / m["generate_s"])
        assert 0 < m["mfu"] < 1e3
    assert summary["mean_mfu"] == pytest.approx(sum(m["mfu"] for m in trainer.history[1:]) / 2)
    assert "mean_learner_tokens_per_s" in summary and "mean_rollout_tokens_per_s" in summary
    for phase in ("generate_s", "reward_s", "train_s", "sync_s", "rollout_idle", "learner_idle"):  # the time split
        assert summary[f"mean_{phase}"] == pytest.approx(sum(m[phase] for m in trainer.history[1:]) / 2)


@pytest.mark.parametrize("experiment", ["sft_tiny", "dpo_tiny"])
def test_an_offline_run_reports_its_learners_throughput_and_mfu(experiment: str, tmp_path: Path) -> None:
    args = [f"experiment={experiment}", "ray.local_mode=true", "callbacks=[]", "trainer.eval_every=0",
            "trainer.final_eval=false", f"trainer.run_root={tmp_path}", "trainer.total_steps=2",
            "learner.strategy=single", "learner.num_workers=1", "learner.peak_tflops=0.001"]
    trainer = ExperimentBuilder(load_config(args)).build_trainer()
    summary = trainer.fit()
    for m in trainer.history:
        assert m["train_tokens"] > 0 and 0 < m["train_seq_len"] <= m["train_tokens"]
        assert m["learner_tokens_per_s"] == pytest.approx(m["train_tokens"] / m["train_s"])
        assert 0 < m["mfu"] < 1e3
    assert summary["mean_mfu"] == pytest.approx(trainer.history[1]["mfu"])
