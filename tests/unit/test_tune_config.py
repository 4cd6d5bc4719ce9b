"""Sweep YAMLs, schedulers, search algorithms, resume lookup and best.yaml, without running a trial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolbox.commands.sweeps.config import SweepJob, load_sweep, prepare
from toolbox.commands.sweeps.results import best_experiment
from toolbox.commands.tune import make_scheduler, make_search, tune_space
from toolbox.config import load_config
from toolbox.core.errors import ConfigError

BASE = "experiment: grpo_tiny\noverrides: [trainer.total_steps=8]\n"


def sweep_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(BASE + body)
    return f"sweep={path}"


def test_asha_uses_the_trainer_step_and_the_experiment_length(tmp_path: Path) -> None:
    from ray.tune.schedulers import ASHAScheduler

    _, sweep, _ = load_sweep([sweep_file(tmp_path, "scheduler: {name: asha, grace_period: 2, reduction_factor: 3}\n"
                                                   "param_space:\n  algorithm.kl_coef: {grid: [0.0, 0.1]}\n")])
    scheduler = make_scheduler(sweep, 8, tmp_path / "scheduler.pkl")
    assert isinstance(scheduler, ASHAScheduler)
    assert scheduler._time_attr == "step" and scheduler._max_t == 8 and scheduler._reduction_factor == 3


def test_asha_rungs_survive_a_restore(tmp_path: Path) -> None:
    """Tune does not save scheduler state with the experiment; ours does, so a resumed sweep still prunes."""
    import pickle

    from ray.tune.experiment import Trial

    _, sweep, _ = load_sweep([sweep_file(tmp_path, "scheduler: {name: asha}\n"
                                                   "param_space:\n  algorithm.kl_coef: {grid: [0.0, 0.1]}\n")])
    state = tmp_path / "scheduler.pkl"
    first = make_scheduler(sweep, 8, state)
    first.set_search_properties("score", "max")
    trials = [Trial("run_trial", trial_id=f"t{i}", stub=True) for i in range(3)]
    for trial, score in zip(trials[:2], (3.0, 1.0)):
        first.on_trial_add(None, trial)
        first.on_trial_result(None, trial, {"step": 1, "score": score})
    restored = pickle.loads(pickle.dumps(make_scheduler(sweep, 8, state)))  # as Tuner.restore unpickles it
    restored.on_trial_add(None, trials[2])
    assert restored.on_trial_result(None, trials[2], {"step": 1, "score": 0.5}) == "STOP"


def test_a_grace_period_longer_than_the_run_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="scheduler.grace_period=9 is more than the 8 steps"):
        load_sweep([sweep_file(tmp_path, "scheduler: {name: asha, grace_period: 9}\n"
                                         "param_space:\n  algorithm.kl_coef: {grid: [0.0]}\n")])


def test_optuna_takes_the_space_and_refuses_a_grid(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    _, sweep, _ = load_sweep([sweep_file(tmp_path, "search: {name: optuna, seed: 3}\nparam_space:\n"
                                                   "  learner.optim.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
                                                   "  algorithm.kl_coef: {choice: [0.0, 0.05]}\n")])
    search = make_search(sweep)
    assert search.set_search_properties("score", "max", tune_space(sweep))
    suggestion = search.suggest("t0")
    assert 1e-4 <= suggestion["learner.optim.lr"] <= 1e-2 and suggestion["algorithm.kl_coef"] in (0.0, 0.05)
    with pytest.raises(ConfigError, match="param_space.algorithm.kl_coef: search optuna samples and cannot take a grid"):
        load_sweep([sweep_file(tmp_path, "search: {name: optuna}\nparam_space:\n  algorithm.kl_coef: {grid: [0.0]}\n")])


def test_resume_finds_the_newest_sweep_and_keeps_its_overrides(tmp_path: Path) -> None:
    arg = sweep_file(tmp_path, "param_space:\n  algorithm.kl_coef: {grid: [0.0]}\n")
    root = f"trainer.run_root={tmp_path / 'out'}"
    with pytest.raises(ConfigError, match="resume=true: no sweep 's' under"):
        prepare([arg, root, "resume=true"])
    for stamp in ("20260101-000000", "20260102-000000"):
        (tmp_path / "out" / "sweeps" / f"s-{stamp}").mkdir(parents=True)
        job = prepare([arg, root])
        (tmp_path / "out" / "sweeps" / f"s-{stamp}" / "sweep.json").write_text(
            json.dumps({"name": "s", "sweep": job.sweep.model_dump(), "extra": job.extra}))
    job = prepare([arg, root, "resume=true"])
    assert job.resume and job.out.name == "s-20260102-000000" and job.extra == [root]
    with pytest.raises(ConfigError, match="a resumed sweep keeps the overrides it started with"):
        prepare([arg, root, "trainer.seed=3", "resume=true"])


def test_best_yaml_is_an_experiment_of_the_trial(tmp_path: Path) -> None:
    import yaml

    _, sweep, extra = load_sweep([sweep_file(tmp_path, "param_space:\n  learner.optim.lr: {grid: [0.001]}\n"),
                                  "trainer.run_root=/somewhere", "trainer.seed=7"])
    job = SweepJob("s", sweep, extra, tmp_path)
    best = tmp_path / "best.yaml"
    best.write_text(yaml.safe_dump(best_experiment(job, {"learner.optim.lr": 0.004, "algorithm.kl_coef": 0.1})))
    cfg = load_config([f"experiment={best}"])
    assert (cfg.learner.optim.lr, cfg.algorithm.kl_coef, cfg.trainer.seed, cfg.trainer.total_steps) == (0.004, 0.1, 7, 8)
    assert cfg.trainer.run_root == "runs"  # where the sweep ran is not part of the experiment
