"""One-step off-policy GRPO on a real local Ray (a rollout worker, a reward worker, a learner rank):
``rollout.max_staleness=1`` samples step t + 1 while the learner trains on step t.

The reward is whether the response starts with a digit, which the random tiny model does about half the time: every
step's groups carry signal, so every update moves the policy (the math reward of a random model is 0 for whole steps).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from toolbox.config import load_config
from toolbox.driver.experiment import ExperimentBuilder

pytestmark = pytest.mark.integration


def fit(tiny_model_dir: Path, tmp_path: Path, steps: int, *overrides: str) -> tuple[Any, list[dict[str, float]]]:
    cfg = load_config(["experiment=grpo_tiny_fsdp2", f"model.path={tiny_model_dir}", f"trainer.run_root={tmp_path}", "callbacks=[]",
                       "trainer.eval_every=0", "trainer.log_samples_every=0", f"trainer.total_steps={steps}",
                       "algorithm.prompts_per_step=8", "learner.optim.warmup_steps=0",
                       "reward.spec={name: format, pattern: '^[0-9]', match: search}", "rollout.num_workers=1",
                       "reward.num_workers=1", "learner.num_workers=1", "learner.strategy=single", *overrides])
    builder = ExperimentBuilder(cfg)
    try:
        trainer = builder.build_trainer()
        trainer.fit()
    finally:
        builder.shutdown()
    return cfg, trainer.history


def test_one_step_ahead_trains_on_batches_of_the_weights_before(ray_session: None, tiny_model_dir: Path,
                                                                 tmp_path: Path) -> None:
    cfg, history = fit(tiny_model_dir, tmp_path, 2, "rollout.max_staleness=1")
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


def test_a_block_of_steps_is_sampled_by_one_call_per_worker(ray_session: None, tiny_model_dir: Path,
                                                           tmp_path: Path) -> None:
    """``rollout.steps_per_generation=2``: one `generate_steps` call (two returns through Ray) samples steps 0 and
    1; each step trains on its own batch: step 0 on policy, step 1 on the weights one update older."""
    _, history = fit(tiny_model_dir, tmp_path, 2, "rollout.max_staleness=1", "rollout.steps_per_generation=2",
                     "rollout.num_workers=2", "algorithm.group_size=4")
    assert [m["staleness"] for m in history] == [0.0, 1.0]
    assert history[0]["behaviour_kl"] < 1e-6, history
    assert history[1]["behaviour_kl"] > 100 * max(history[0]["behaviour_kl"], 1e-9), history
    for m in history:  # each step timed by its share of the call
        assert math.isfinite(m["loss"]) and m["generate_s"] > 0
