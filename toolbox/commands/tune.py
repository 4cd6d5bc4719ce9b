"""``toolbox tune sweep=NAME [resume=true] [a.b=value ...]``: a Ray Tune sweep in which every trial is one whole experiment.

A sweep YAML (``configs/sweeps/NAME.yaml``) names a base experiment, fixed overrides,
a ``param_space`` of dotted config paths (``{grid: [...]}``, ``{choice: [...]}``,
``{uniform: [lo, hi]}``, ``{loguniform: [lo, hi]}``), the reported metric to optimise, a
``scheduler`` (``fifo``, or ``asha``: stops trials whose score trails at ``grace_period``,
``grace_period * reduction_factor``, ... steps) and a ``search`` (``basic``: grid and random
variants; ``optuna``: Optuna's TPE through Tune, the optional extra ``toolbox[optuna]``).

Each trial validates its config before anything starts, runs the experiment's algorithm (its
own worker groups and placement groups) and reports every step's metrics to Tune; its score is
the metric's mean over the last 10% of its steps so far (what ASHA compares at each rung). A step
that wrote a checkpoint reports it to Tune (`tune.report(..., checkpoint=)`), so a trial that
Tune restores (``resume=true``, a paused trial) continues from it (``trainer.resume_from``) in
its own run directory (``runs/<trial name>``). An interrupted sweep (Ctrl+C, SIGUSR1, a lost
driver) exits 130; ``resume=true`` (the newest sweep of that name under ``trainer.run_root``) or
``resume=<sweep dir>`` finishes it with `Tuner.restore`: finished trials are kept, unfinished
ones continue from their last checkpoint, and ASHA keeps its rungs (`toolbox.commands.sweeps.state`).

Results in ``<run_root>/sweeps/<name>-<time>/``: a ranked table in the console,
``results.csv``, ``sweep.png``, and ``best.yaml``, the best trial as an experiment
(``base:`` the sweep's experiment plus what the trial changed) for
``toolbox run experiment=<sweep dir>/best.yaml``.

Each trial reserves one placement group: a bundle for its driver, then one per actor of
its experiment (`toolbox.driver.placement.trial_bundles`); the experiment's worker groups are
placed in those bundles, so Tune schedules whole experiments and never over-commits.
Python API: `toolbox.commands.sweeps.trial.toolbox_trainable` wraps the same trainable for a `ray.tune.Tuner` of your own
(docs/examples/tune_api.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from toolbox.commands.sweeps.config import SweepConfig, SweepJob, prepare
from toolbox.commands.sweeps.results import interrupted, write_results
from toolbox.commands.sweeps.trial import SCORE, toolbox_trainable
from toolbox.config.loader import load_config
from toolbox.core.errors import ConfigError

INTERRUPTED = 130  # exit code of an interrupted sweep, as a shell reports a Ctrl+C


def tune_space(sweep: SweepConfig) -> dict[str, Any]:
    from ray import tune

    makers = {"grid": tune.grid_search, "choice": tune.choice,
              "uniform": lambda v: tune.uniform(*v), "loguniform": lambda v: tune.loguniform(*v)}
    return {key: makers[kind](values) for key, spec in sweep.param_space.items() for kind, values in spec.items()}


def make_scheduler(sweep: SweepConfig, total_steps: int, state_path: Path) -> Any:
    from ray.tune.schedulers import FIFOScheduler

    from toolbox.commands.sweeps.state import ResumableASHA

    s = sweep.scheduler
    if s.name == "fifo":
        return FIFOScheduler()
    return ResumableASHA(state_path, time_attr="step", max_t=s.max_t or total_steps, grace_period=s.grace_period,
                         reduction_factor=s.reduction_factor)


def make_search(sweep: SweepConfig) -> Any:
    if sweep.search.name == "basic":
        return None
    try:
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(seed=sweep.search.seed)
    except (ImportError, AssertionError) as err:  # Ray asserts that optuna is installed
        raise ConfigError(f"search.name=optuna needs Optuna: pip install 'toolbox[optuna]' ({err})") from None


def make_tuner(job: SweepJob) -> Any:
    """A new Tuner for ``job``, or the interrupted one restored from ``job.out``."""
    from ray import tune

    from toolbox.commands.sweeps.state import TrialsEnded

    trainable = toolbox_trainable(job.base, job.sweep.metric)
    path = job.out / "tune" / job.name
    if job.resume:
        return tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True)
    sweep = job.sweep
    job.out.mkdir(parents=True, exist_ok=True)
    (job.out / "sweep.json").write_text(json.dumps({"name": job.name, "sweep": sweep.model_dump(), "extra": job.extra}))
    total_steps = load_config(job.base).trainer.total_steps
    return tune.Tuner(trainable, param_space=tune_space(sweep),
                      tune_config=tune.TuneConfig(metric=SCORE, mode=sweep.mode, num_samples=sweep.num_samples,
                                                  max_concurrent_trials=sweep.max_concurrent_trials,
                                                  scheduler=make_scheduler(sweep, total_steps,
                                                                           job.out / "scheduler.pkl"),
                                                  search_alg=make_search(sweep), reuse_actors=True),
                      run_config=tune.RunConfig(name=job.name, storage_path=str(job.out / "tune"), verbose=0,
                                                callbacks=[TrialsEnded(job.out / "ended.json")],
                                                checkpoint_config=tune.CheckpointConfig(
                                                    num_to_keep=sweep.keep_checkpoints)))


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 1 a trial failed, 2 a bad sweep or config, 130 interrupted (resume with resume=true)."""
    from rich.console import Console

    console = Console(stderr=True)
    args = sys.argv[1:] if argv is None else argv
    try:
        job = prepare(args)
    except ConfigError as err:
        console.print(f"config error: {err}", markup=False)
        return 2
    import ray

    from toolbox.driver.ray_connect import connect_ray

    if not ray.is_initialized():
        connect_ray(load_config(job.base))
    try:
        tuner = make_tuner(job)
    except ConfigError as err:
        console.print(f"config error: {err}", markup=False)
        return 2
    results = tuner.fit()
    if interrupted(job):
        again = " ".join(a for a in args if not a.startswith("resume="))
        console.print(f"sweep interrupted; finish it with: toolbox tune {again} resume=true  (or resume={job.out})",
                      markup=False)
        return INTERRUPTED
    write_results(job, results, console)
    return 1 if results.num_errors else 0


if __name__ == "__main__":
    sys.exit(main())
