"""`toolbox.algorithms.grpo.learner.GRPOLearner` (strategy 'single', no Ray): micro-batch size changes neither the update nor its metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.learner_steps import online_step
from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.grpo.learner import GRPOLearner
from toolbox.engines.base import PromptRequest, SamplingConfig
from toolbox.engines.hf import HFEngine
from toolbox.learner.config import LearnerConfig
from toolbox.models.loading import load_causal_lm
from toolbox.rewards.base import RewardResult, RewardStatus
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.weights import unpack_all

GROUP = 4


@pytest.fixture(scope="module")
def rollout(tiny_model_dir: Path) -> tuple[list[RolloutBatch], list[RewardResult]]:
    engine = HFEngine(str(tiny_model_dir), seed=0)
    torch.manual_seed(0)
    reqs = [PromptRequest(engine.tokenizer(p)["input_ids"], g) for g, p in enumerate(["1+2=", "3+4=", "10+1=", "0+0="])
            for _ in range(GROUP)]
    batch = engine.generate(reqs, SamplingConfig(max_new_tokens=5))
    gen = torch.Generator().manual_seed(0)
    status = torch.zeros(len(batch), dtype=torch.long)
    status[3], status[6] = RewardStatus.ERROR, RewardStatus.ABSTAIN
    values = torch.rand(len(batch), generator=gen).round() * (status == 0)
    # Two rollout shards with their reward results, as two rollout / reward workers would return them.
    half = len(batch) // 2
    results = [RewardResult(values[:half], status[:half], [""] * half), RewardResult(values[half:], status[half:], [""] * half)]
    return batch.split(2), results


def make_learner(path: Path, micro: int) -> GRPOLearner:
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=micro,
                        optim={"lr": 1e-3, "scheduler": "constant", "max_grad_norm": 100.0})
    algo = GRPOConfig(prompts_per_step=4, group_size=GROUP, kl_coef=0.1, kl_kind="k3",
                      loss={"clip_low": 0.2, "clip_high": 0.28},
                      ppo_epochs=2, mini_batches=2)
    torch.manual_seed(0)
    return GRPOLearner(str(path), "float32", cfg, algo, total_steps=10)


def test_micro_batch_size_does_not_change_update_or_metrics(tiny_model_dir: Path, rollout) -> None:  # noqa: ANN001
    shards, results = rollout
    big, small = make_learner(tiny_model_dir, 8), make_learner(tiny_model_dir, 1)
    m_big, m_small = online_step(big, shards, results), online_step(small, shards, results)
    assert big.policy.step == small.policy.step == 1
    for key in ("loss", "pg_loss", "kl", "clip_frac", "grad_norm", "reward", "reward_error", "reward_abstain", "adv_abs"):
        assert m_small[key] == pytest.approx(m_big[key], rel=1e-4, abs=1e-6), key
    assert m_big["reward_error"] == 1.0 and m_big["reward_abstain"] == 1.0
    assert m_big["grad_norm"] > 0 and m_big["kl"] > 0  # the second epoch has moved off the reference
    a, b = big.policy.full_state_dict(), small.policy.full_state_dict()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=5e-5, rtol=0)
    # The update moved the policy, and export_weights ships exactly the learner's current weights.
    fresh = load_causal_lm(str(tiny_model_dir)).state_dict()
    assert any(not torch.equal(a[k], fresh[k]) for k in a)
    exported = unpack_all(big.policy.export_weights())
    assert exported.keys() == a.keys() and all(torch.equal(exported[k], v) for k, v in a.items())

