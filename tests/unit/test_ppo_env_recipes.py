"""Learning starts with the shipped recipes `ppo_halfcheetah` (MuJoCo) and `ppo_lunarlander` (Box2D): shortened
runs in-process (``ray.local_mode``, no Ray) whose mean training return rises.

The full runs (1M and 2M env steps) are measured in docs/classic-rl.md; these only check that each recipe
learns at all, on the recipe's own settings, seed 0 (deterministic: same seed, same returns).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from toolbox.config import load_config
from toolbox.driver.experiment import ExperimentBuilder

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny networks: a second thread only contends


def training_returns(tmp_path: Path, experiment: str, steps: int, window: int, *overrides: str) -> list[float]:
    """The mean return of the last ``window`` training episodes after each of ``steps`` training steps."""
    cfg = load_config([f"experiment={experiment}", "ray.local_mode=true", "callbacks=[]", f"trainer.run_root={tmp_path}",
                       f"trainer.total_steps={steps}", "trainer.save_every=0", "trainer.eval_every=0",
                       f"algorithm.return_window={window}", "algorithm.target_return=null", *overrides])
    trainer = ExperimentBuilder(cfg).build_trainer()
    trainer.fit()
    returns = [m["episode_return"] for m in trainer.history if m["episode_return"] == m["episode_return"]]  # not NaN
    print(f"{experiment}: training return {returns[0]:.0f} -> {returns[-1]:.0f} after {trainer.env_steps} env steps")
    return returns


@pytest.mark.slow
def test_halfcheetah_return_rises_over_the_first_32k_env_steps(tmp_path: Path) -> None:
    pytest.importorskip("mujoco", reason="the mujoco extra (pip install -e '.[mujoco]'; `make setup` installs it)")
    # The first 16 steps (32,768 env steps) of the 489-step recipe, whose linear lr decay is under 4% by then
    # (so: constant lr). Every env copy ends an episode each 1,000 steps: the first 8 vs the fourth 8 episodes.
    returns = training_returns(tmp_path, "ppo_halfcheetah", 16, 8, "learner.optim.scheduler=constant")
    assert returns[-1] > returns[0] + 50, returns  # measured: -366 -> -257 (-366 -> -192 after 24 steps)


def test_lunarlander_return_rises_over_the_first_8k_env_steps(tmp_path: Path) -> None:
    pytest.importorskip("Box2D", reason="the box2d extra (pip install -e '.[box2d]'; `make setup` installs it)")
    returns = training_returns(tmp_path, "ppo_lunarlander", 4, 20)  # 4 x 2,048 env steps
    assert returns[-1] > returns[0] + 50, returns  # a fresh policy crashes (about -230); it learns to slow down
