"""The multi-turn tool recipe (`grpo_tool_calc_tiny`) on a real local Ray: 2 rollout workers running episodes with
the calculator tool, 2 reward workers passing the env's score on, 2 FSDP2 learner ranks training on the model's
own tokens."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from toolbox.actors.learner import LearnerWorker
from toolbox.actors.rollout import RolloutWorker

from toolbox.config import load_config
from toolbox.driver.experiment import ExperimentBuilder
from toolbox.models.loading import load_causal_lm

pytestmark = pytest.mark.integration


def test_tool_recipe_trains_two_steps(ray_session: None, tmp_path: Path) -> None:
    cfg = load_config(["experiment=grpo_tool_calc_tiny", f"trainer.run_root={tmp_path}", "callbacks=[]",
                       # 16 groups: the recipe's prefix credit pays a random model only in a group where some
                       # episode starts with the call's first character, and a step with every group tied trains
                       # nothing (4 groups were all tied for 2 steps).
                       "trainer.total_steps=2", "algorithm.prompts_per_step=16", "learner.micro_batch_size=16",
                       # the recipe's SFT cold start, cut to 2 steps (tests/unit/test_cold_start.py checks it)
                       "model.cold_start.overrides=[trainer.total_steps=2, algorithm.batch_size=8]"])
    builder = ExperimentBuilder(cfg)
    trainer = builder.build_trainer()
    try:
        summary = trainer.fit()
        assert summary["steps"] == 2
        # Every episode was scored: an env or reward failure would make the step's mean reward NaN or raise.
        assert math.isfinite(summary["reward_first_10pct"]) and math.isfinite(summary["reward_last_10pct"])
        learner_sd = trainer.learner.group.each(LearnerWorker.full_state_dict).result()[0]
        initial = load_causal_lm(builder.model_path).state_dict()
        assert any(not torch.equal(learner_sd[k], initial[k]) for k in initial), "the learner did not train"
        rollout_sd = trainer.rollout.group.each(RolloutWorker.state_dict).result()[0]  # the multi_turn engine forwards weight sync
        assert all(torch.equal(rollout_sd[k], v) for k, v in learner_sd.items())
    finally:
        builder.shutdown()
