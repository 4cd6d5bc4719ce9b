"""GRPO on stored rollouts on a real local Ray: a tiny GRPO run records its samples (with behaviour log-probs), and
``offline_grpo`` trains 2 FSDP2 learner ranks (gloo) on that samples.jsonl, with no rollout or reward workers; the
trained policy makes the stored samples of above-average reward more likely, the others less."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from toolbox.actors.learner import LearnerWorker

from toolbox.algorithms.offline_grpo.learner import stored_batch
from toolbox.config import load_config
from toolbox.data.rollouts import load_rollout_groups
from toolbox.driver.experiment import ExperimentBuilder
from toolbox.models.loading import load_causal_lm, load_tokenizer
from toolbox.models.logprobs import response_logprobs
from toolbox.rl.advantages import grpo_advantages

pytestmark = pytest.mark.integration
GROUP = 8


def fit(*overrides: str) -> tuple[list[dict[str, float]], Path, dict[str, torch.Tensor], str]:
    """The step metrics of a whole run, its run directory, the final policy weights and the model's path."""
    builder = ExperimentBuilder(load_config(["callbacks=[{name: jsonl}]", "trainer.eval_every=0",
                                             "trainer.final_eval=false", "trainer.save_every=0", *overrides]))
    try:
        trainer: Any = builder.build_trainer()
        trainer.fit()
        state = trainer.learner.group.each(LearnerWorker.full_state_dict).result()[0]
        return trainer.history, builder.run_dir, state, builder.model_path
    finally:
        builder.shutdown()


def advantage_weighted_logp(model: torch.nn.Module, samples: str, tokenizer: Any) -> float:
    """``sum_b adv_b x log p(response_b)`` over every stored group: what the policy gradient climbs."""
    batch, rewards = stored_batch(load_rollout_groups(samples, GROUP), tokenizer)
    adv_B, _ = grpo_advantages(rewards.values_B, GROUP, "group_norm", rewards.ok_B)
    with torch.no_grad():
        logp_B = response_logprobs(model.eval(), batch, 1.0).sum(1)
    return float((adv_B * logp_B).sum())


def test_offline_grpo_trains_on_a_runs_samples(ray_session: None, tmp_path: Path) -> None:
    _, source, _, _ = fit("experiment=grpo_tiny", f"trainer.run_root={tmp_path}", "trainer.run_name=source",
                          "trainer.total_steps=2", "trainer.log_samples_every=1", "trainer.log_samples=16")
    samples = source / "samples.jsonl"
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(lines) == 2 * 16 * GROUP  # 2 steps x every one of grpo_tiny's 16 groups x 8 samples
    first = lines[0]["outputs"]
    assert len(first["logprobs"]) == len(first["response_ids"]) == first["response_tokens"] > 0
    assert all(lp <= 0 for s in lines for lp in s["outputs"]["logprobs"])

    history, run, trained, model_path = fit(
        "experiment=offline_grpo_tiny", f"trainer.run_root={tmp_path}", "trainer.run_name=offline",
        f"algorithm.dataset={samples}", "algorithm.prompts_per_step=8", "trainer.total_steps=8",
        "learner.num_workers=2", "learner.strategy=fsdp2", "learner.micro_batch_size=8")
    assert len(history) == 8 and not (run / "samples.jsonl").exists()  # no rollouts of its own
    assert {"pg_loss", "behaviour_kl", "tis_frac", "reward", "grad_norm"} <= history[0].keys()
    assert history[-1]["behaviour_kl"] > history[0]["behaviour_kl"]  # the policy moves off the one that sampled
    tokenizer, model = load_tokenizer(model_path), load_causal_lm(model_path)
    before = advantage_weighted_logp(model, str(samples), tokenizer)
    model.load_state_dict(trained)
    after = advantage_weighted_logp(model, str(samples), tokenizer)
    assert after > before + 1.0, (before, after)
