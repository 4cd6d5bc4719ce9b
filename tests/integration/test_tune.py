"""Ray Tune sweeps where every trial is a whole experiment (in-process, or with real actors)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from toolbox.tune import main

pytestmark = pytest.mark.integration


def run_sweep(tmp_path: Path, sweep_yaml: str) -> tuple[Path, list[dict[str, str]]]:
    """Write the sweep, run it (it must succeed), return its directory and its results.csv rows."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(sweep_yaml)
    assert main([f"sweep={sweep}", f"trainer.run_root={tmp_path / 'out'}"]) == 0
    (sweep_dir,) = (tmp_path / "out" / "sweeps").iterdir()
    return sweep_dir, list(csv.DictReader((sweep_dir / "results.csv").open()))


def test_grid_sweep_runs_every_trial_and_writes_results(ray_session: None, tmp_path: Path) -> None:
    sweep_dir, rows = run_sweep(tmp_path, (
        "experiment: grpo_tiny\n"
        "overrides: [trainer.total_steps=3, trainer.eval_every=0, ray.local_mode=true, learner.num_workers=1,\n"
        "            learner.strategy=single, algorithm.prompts_per_step=4, learner.micro_batch_size=8]\n"
        "metric: reward\nmode: max\n"
        "param_space:\n  learner.optim.lr: {grid: [1.0e-3, 3.0e-3]}\n"
    ))
    assert sorted(float(r["config/learner.optim.lr"]) for r in rows) == [1e-3, 3e-3]
    assert all(r["step"] == "3" for r in rows)
    assert (sweep_dir / "sweep.png").exists()


def test_a_bad_value_in_the_space_fails_before_any_trial(tmp_path: Path) -> None:
    sweep = tmp_path / "bad.yaml"
    sweep.write_text("experiment: grpo_tiny\nparam_space:\n  learner.num_workers: {grid: [2, 3]}\n")
    assert main([f"sweep={sweep}", f"trainer.run_root={tmp_path}"]) == 2
    assert not (tmp_path / "sweeps").exists()


def test_trials_place_their_actors_in_the_trial_placement_group(ray_session: None, tmp_path: Path) -> None:
    """Real actors (2 FSDP2 learner ranks per trial) inside each trial's own placement group, 2 trials at once."""
    from toolbox.config import load_config
    from toolbox.experiment import trial_bundles

    cfg = load_config(["rollout.num_workers=1", "reward.num_workers=1"])
    assert trial_bundles(cfg) == [{"CPU": 0.01}, {"CPU": 0.25}, {"CPU": 0.1}, {"CPU": 0.5}, {"CPU": 0.5}]
    _, rows = run_sweep(tmp_path, (
        "experiment: grpo_tiny\n"
        "overrides: [trainer.total_steps=2, trainer.eval_every=0, rollout.num_workers=1, reward.num_workers=1,\n"
        "            algorithm.prompts_per_step=4, learner.micro_batch_size=8]\n"
        "max_concurrent_trials: 2\n"
        "param_space:\n  algorithm.kl_coef: {grid: [0.0, 0.05]}\n"
    ))
    assert len(rows) == 2 and all(r["step"] == "2" for r in rows)
