"""The ppo_env trainer in-process (``ray.local_mode``): it learns, it is reproducible, it stops at the target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolbox.algorithms.ppo_env.loop import split_counts
from toolbox.config import load_config
from toolbox.driver.experiment import ExperimentBuilder


def fit(tmp_path: Path, *overrides: str) -> tuple[dict[str, Any], Any]:
    cfg = load_config(["experiment=ppo_cartpole", "ray.local_mode=true", f"trainer.run_root={tmp_path}", "callbacks=[]",
                       *overrides])
    builder = ExperimentBuilder(cfg)
    trainer = builder.build_trainer()
    return trainer.fit(), trainer


def test_same_seed_same_returns_other_seed_other_returns(tmp_path: Path) -> None:
    args = ("trainer.total_steps=4", "trainer.eval_every=2", "algorithm.target_return=null")
    a, ta = fit(tmp_path, *args)
    b, tb = fit(tmp_path, *args)
    c, tc = fit(tmp_path, *args, "trainer.seed=7")
    returns = lambda t: [m["episode_return"] for m in t.history]  # noqa: E731
    assert returns(ta) == returns(tb) and a["eval_return"] == b["eval_return"]
    assert returns(ta) != returns(tc)
    assert a["env_steps"] == 4 * 2 * 4 * 128 and a["steps"] == 4
    assert (Path(a["last_checkpoint"]) / ".metadata").exists()


def test_stops_early_at_the_target_and_resumes(tmp_path: Path) -> None:
    summary, _ = fit(tmp_path, "algorithm.target_return=30", "trainer.eval_every=1", "trainer.run_name=early")
    assert summary["reached_target"] and summary["eval_return"] >= 30 and summary["steps"] < 150
    step = summary["steps"]
    resumed, trainer = fit(tmp_path, f"trainer.resume_from={tmp_path / 'early'}", f"trainer.total_steps={step + 1}",
                           "algorithm.target_return=null", "trainer.run_name=resumed")
    assert resumed["steps"] == step + 1 and trainer.history and len(trainer.history) == 1
    assert resumed["env_steps"] == (step + 1) * 1024


def test_eval_episodes_split_over_runners() -> None:
    assert split_counts(20, 2) == [10, 10] and split_counts(21, 4) == [6, 5, 5, 5] and sum(split_counts(3, 5)) == 3
