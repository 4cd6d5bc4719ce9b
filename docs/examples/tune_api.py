"""A sweep from Python: a Ray Tune ``Tuner`` around the toolbox trainable, the search space in plain Python.

    python docs/examples/tune_api.py [a.b.c=value ...]

Every trial is one whole experiment (``grpo_tiny`` here): the trainable takes the experiment's
overrides, and each entry of ``param_space`` is a dotted config path set per trial. Tune's own
schedulers and searchers plug in as usual; the trial reports every step's metrics and a ``score``
(the metric's mean over the last 10% of steps so far). Extra ``a.b.c=value`` arguments are added to
every trial (the test runs this script with a handful of steps).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ray import tune
from ray.tune.schedulers import ASHAScheduler

from toolbox.commands.sweeps.trial import SCORE, toolbox_trainable
from toolbox.config import load_config


def main(overrides: list[str]) -> tune.ResultGrid:
    base = ["experiment=grpo_tiny", "trainer.total_steps=20", "trainer.eval_every=0", *overrides]
    trainable = toolbox_trainable(base, metric="reward")
    storage = Path(load_config(base).trainer.run_root).resolve() / "tune_api"  # Tune's results and checkpoints
    tuner = tune.Tuner(
        trainable,
        param_space={  # dotted config paths -> Tune search spaces
            "learner.optim.lr": tune.grid_search([1e-3, 3e-3]),
            "algorithm.kl_coef": tune.choice([0.0, 0.05]),
        },
        tune_config=tune.TuneConfig(metric=SCORE, mode="max", max_concurrent_trials=2,
                                    scheduler=ASHAScheduler(time_attr="step", grace_period=1, max_t=20)),
        run_config=tune.RunConfig(name="tune_api", storage_path=str(storage), verbose=0),
    )
    results = tuner.fit()
    best = results.get_best_result()
    print(f"best: {best.config} score {best.metrics[SCORE]:.3f}, run directory {best.metrics['run_dir']}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
