"""One-step off-policy GRPO on a real local Ray (a rollout worker, a reward worker, a learner rank):
``rollout.max_staleness=1`` samples step t + 1 while the learner trains on step t.

The reward is whether the response starts with a digit, which the random tiny model does about half the time: every
step's groups carry signal, so every update moves the policy (the math reward of a random model is 0 for whole steps).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from toolbox.config import load_config
from toolbox.experiment import ExperimentBuilder

pytestmark = pytest.mark.integration


def test_one_step_ahead_trains_on_batches_of_the_weights_before(ray_session: None, tiny_model_dir: Path,
                                                                 tmp_path: Path) -> None:
    cfg = load_config([f"model.path={tiny_model_dir}", f"trainer.run_root={tmp_path}", "callbacks=[]",
                       "trainer.eval_every=0", "trainer.log_samples_every=0", "trainer.total_steps=2",
                       "algorithm.prompts_per_step=8", "learner.optim.warmup_steps=0", "rollout.max_staleness=1",
                       "reward.spec={name: format, pattern: '^[0-9]', match: search}", "rollout.num_workers=1",
                       "reward.num_workers=1", "learner.num_workers=1", "learner.strategy=single"])
    builder = ExperimentBuilder(cfg)
    try:
        trainer = builder.build_trainer()
        trainer.fit()
    finally:
        builder.shutdown()
    history = trainer.history
    assert cfg.algorithm.tis_cap == 2.0  # type: ignore[attr-defined]  # unset: on, since max_staleness > 0
    assert [m["staleness"] for m in history] == [0.0, 1.0]
    for m in history:
        assert math.isfinite(m["loss"]) and 0.0 <= m["tis_frac"] <= 1.0
        assert 0.0 <= m["rollout_idle"] <= 1.0 and 0.0 <= m["learner_idle"] <= 1.0
    # Step 0's batch was sampled with the learner's own weights: the engine's log-probs are the learner's, up to
    # float noise. Step 1 trains on a batch sampled with the weights one update older, which only holds if step 0's
    # weight sync reached the engine after it had sampled step 1 (Ray runs a worker's calls in the order the driver
    # submitted them).
    first, later = history[0]["behaviour_kl"], history[1]["behaviour_kl"]
    assert first < 1e-6, history
    assert later > 100 * max(first, 1e-9), history
