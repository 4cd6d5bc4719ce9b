"""GRPO's update on 2 FSDP2 ranks (real Ray, gloo) equals the update on 1 rank for the same global batch.

The two ranks go through the online contract: rank 0 plans the step, and each rank fetches only the
rollout shard its rows are in (the shards are object refs, as the rollout workers return them).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import ray
import torch
from toolbox.actors.calls import Args
from toolbox.actors.group import WorkerGroup
from toolbox.actors.learner import LearnerWorker

from tests.unit.learner_steps import online_step
from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.grpo.learner import GRPOLearner
from toolbox.data.prompts import PromptSource
from toolbox.data.tasks import TASKS
from toolbox.engines.base import SamplingConfig
from toolbox.engines.hf import HFEngine
from toolbox.learner.config import LearnerConfig, OptimConfig
from toolbox.rewards.base import RewardResult

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_two_fsdp2_ranks_update_like_one(ray_session: None, tiny_model_dir: Path, agg: str) -> None:
    path = str(tiny_model_dir)
    engine = HFEngine(path, seed=0)
    requests = PromptSource(TASKS.build({"name": "digit_add"}), engine.tokenizer, seed=0).step(0, 8, 4)
    batch = engine.generate(requests, SamplingConfig(max_new_tokens=4))
    values = torch.randint(0, 2, (len(batch),), generator=torch.Generator().manual_seed(0)).float()
    rewards = RewardResult(values, torch.zeros(len(batch), dtype=torch.long), [""] * len(batch))
    algo = GRPOConfig(prompts_per_step=8, group_size=4, kl_coef=0.1, loss={"agg": agg}, ppo_epochs=2)
    cfg = LearnerConfig(num_workers=2, strategy="fsdp2", micro_batch_size=4, optim=OptimConfig(lr=1e-3))

    single = GRPOLearner(path, "float32", cfg.model_copy(update={"num_workers": 1, "strategy": "single"}), algo, 1)
    m1 = online_step(single, [batch], [rewards])
    one = single.policy.full_state_dict()

    group = WorkerGroup("learner", LearnerWorker, 2, lambda r: dict(
        rank=r, world_size=2, build=partial(GRPOLearner, path, "float32", cfg, algo, 1), distributed=True),
        timeout_s=120, cpus=0.5)
    try:
        addr, port = group.call(LearnerWorker.rendezvous, [Args()], ranks=[0])[0]
        group.each(LearnerWorker.setup, addr, port, 120).result()
        shards = batch.split(2)
        shard_refs = [ray.put(s) for s in shards]
        reward_refs = [ray.put(rewards.select(torch.arange(i * 16, (i + 1) * 16))) for i in range(2)]
        plan = group.call(LearnerWorker.plan, [Args(shard_refs, reward_refs, None)], ranks=[0])[0]
        assert [plan.shards_for(r) for r in range(2)] == [[0], [1]]  # each rank fetches only its own shard
        per_rank = group.each(LearnerWorker.update_planned, plan, shard_refs).result()
        two = group.each(LearnerWorker.full_state_dict).result()[0]
    finally:
        group.shutdown()
    # Each rank's loss is its share of the global normalisation, so the ranks' mean is the global loss.
    assert sum(m["loss"] for m in per_rank) / 2 == pytest.approx(m1["loss"], rel=1e-4, abs=1e-6)
    assert per_rank[0]["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)
    assert any(not torch.equal(one[k], v) for k, v in engine.state_dict().items()), "the update moved nothing"
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
