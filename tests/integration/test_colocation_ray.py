"""``rollout.placement: colocate`` on a real local Ray (CPU): rollout worker i lands in learner rank i's bundle of one
shared placement group, and a GRPO run with sleeping engines finishes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from ray.util.placement_group import placement_group_table

from toolbox.config import load_config
from toolbox.driver.experiment import ExperimentBuilder

pytestmark = pytest.mark.integration


def test_colocated_run_shares_bundles_and_finishes(ray_session: None, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_config(["experiment=grpo_tiny_fsdp2", f"trainer.run_root={tmp_path}", "callbacks=[]", "trainer.eval_every=0",
                       "trainer.total_steps=1",
                       "rollout.placement=colocate", "rollout.num_workers=2", "learner.num_workers=2", "reward.num_workers=1",
                       "algorithm.prompts_per_step=4", "algorithm.group_size=4", "learner.micro_batch_size=8",
                       "rollout.sampling.max_new_tokens=4"])
    builder = ExperimentBuilder(cfg)
    try:
        with caplog.at_level(logging.INFO, logger="toolbox.driver.weight_sync"):
            trainer = builder.build_trainer()
        rollout, learner = trainer.rollout.group, trainer.learner.group
        # What each actor reports from inside: (placement group id, bundle index); worker i and rank i share one.
        assert rollout.bundles == learner.bundles
        assert [b for _, b in rollout.bundles] == ["0", "1"]
        pg = rollout.bundles[0][0]
        assert pg is not None and {p for p, _ in rollout.bundles} == {pg}
        assert rollout.node_ids == learner.node_ids
        bundles = placement_group_table(builder._colocated_pg)["bundles"]
        assert bundles[0] == {"CPU": cfg.rollout.cpus_per_worker + cfg.learner.cpus_per_worker}
        assert "weight sync: shared_memory (learner rank 0 and every hf engine on one node)" in caplog.text
        summary = trainer.fit()
        assert summary["steps"] == 1
    finally:
        builder.shutdown()
    assert builder._colocated_pg is None
    assert placement_group_table().get(pg, {}).get("state") in (None, "REMOVED")
