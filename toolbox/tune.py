"""``python -m toolbox.tune sweep=NAME [a.b=value ...]``: a Ray Tune sweep in which every trial is one whole experiment.

A sweep YAML (``configs/sweeps/NAME.yaml``) names a base experiment, fixed overrides,
a ``param_space`` of dotted config paths (``{grid: [...]}``, ``{choice: [...]}``,
``{uniform: [lo, hi]}``, ``{loguniform: [lo, hi]}``), and the reported metric to
optimise. Each trial validates its config before anything starts, runs the experiment's
algorithm (its own worker groups and placement groups) and reports every step's metrics to
Tune; its score is the metric's mean over the last 10% of its steps. Results: a table in
the console, ``results.csv`` and ``sweep.png`` in ``<run_root>/sweeps/<name>-<time>/``.

Each trial reserves one placement group: a bundle for its driver, then one per actor of
its experiment (`toolbox.experiment.trial_bundles`); the experiment's worker groups are
placed in those bundles, so Tune schedules whole experiments and never over-commits.
"""

from __future__ import annotations

import datetime as dt
import sys
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from toolbox.config.loader import CONFIG_DIR, load_config, parse_overrides
from toolbox.core.errors import ConfigError

SCORE = "score"


class SweepConfig(BaseModel):
    """A sweep: a base experiment, what varies, what is optimised."""

    model_config = ConfigDict(extra="forbid")
    experiment: str = Field(description="Base experiment (configs/experiments/NAME.yaml).")
    overrides: list[str] = Field(default_factory=list, description="Dotted overrides every trial gets.")
    param_space: dict[str, dict[str, list[float | int | str]]] = Field(description="Dotted path -> {grid|choice|uniform|loguniform: values}.")
    metric: str = Field("reward", description="Step metric to optimise (mean over the last 10% of steps).")
    mode: str = Field("max", pattern="^(max|min)$", description="Maximise or minimise the metric.")
    num_samples: int = Field(1, ge=1, description="Samples of the space (repeats of the grid).")
    max_concurrent_trials: int = Field(1, ge=1, description="Trials running at once.")


def load_sweep(args: list[str]) -> tuple[str, SweepConfig, list[str]]:
    """``sweep=NAME`` plus extra overrides for every trial; fails on a bad sweep or a bad trial config."""
    flat = parse_overrides(args)
    name = str(flat.pop("sweep", ""))
    path = Path(name) if name.endswith((".yaml", ".yml")) else CONFIG_DIR / "sweeps" / f"{name}.yaml"
    name = path.stem
    if not name or not path.exists():
        known = sorted(p.stem for p in (CONFIG_DIR / "sweeps").glob("*.yaml"))
        raise ConfigError(f"sweep={name or '?'}: no {path}; known sweeps: {known}")
    sweep = SweepConfig.model_validate(yaml.safe_load(path.read_text()))
    extra = [a for a in args if not a.startswith("sweep=")]
    for key, spec in sweep.param_space.items():
        if len(spec) != 1 or next(iter(spec)) not in {"grid", "choice", "uniform", "loguniform"}:
            raise ConfigError(f"{path}: param_space.{key}: give one of grid/choice/uniform/loguniform, got {spec}")
        # Every value must make a valid experiment, checked before any trial starts.
        for value in next(iter(spec.values())):
            load_config([f"experiment={sweep.experiment}", *sweep.overrides, *extra, f"{key}={value}"])
    return name, sweep, extra


def tune_space(sweep: SweepConfig) -> dict[str, Any]:
    from ray import tune

    makers = {"grid": tune.grid_search, "choice": tune.choice,
              "uniform": lambda v: tune.uniform(*v), "loguniform": lambda v: tune.loguniform(*v)}
    return {key: makers[kind](values) for key, spec in sweep.param_space.items() for kind, values in spec.items()}


def trial_resources(base: list[str], params: dict[str, Any]) -> Any:
    """One placement group per trial: its driver's bundle, then a bundle for every actor of its experiment."""
    from ray.tune import PlacementGroupFactory

    from toolbox.experiment import trial_bundles

    cfg = load_config([*base, *(f"{k}={v}" for k, v in params.items())])
    return PlacementGroupFactory([{"CPU": 0.01}] if cfg.ray.local_mode else trial_bundles(cfg))


def run_trial(params: dict[str, Any], base: list[str], metric: str) -> None:
    """One trial: the whole experiment, every step's metrics reported to Tune."""
    import ray
    from ray import tune

    from toolbox.core.events import Event
    from toolbox.experiment import ExperimentBuilder

    cfg = load_config([*base, *(f"{k}={v}" for k, v in params.items()), "callbacks=[{name: jsonl}]"])
    builder = ExperimentBuilder(cfg)
    if not cfg.ray.local_mode:  # the trial's actors live in bundles of the trial's placement group
        builder.use_placement_group(ray.util.get_current_placement_group())
    history: list[float] = []
    try:
        trainer = builder.build_trainer()

        def report(_: Event, payload: dict[str, Any]) -> None:
            history.append(float(payload["metrics"].get(metric, float("nan"))))
            k = max(1, len(history) // 10)
            tune.report({**payload["metrics"], "step": payload["step"], SCORE: sum(history[-k:]) / k,
                         "run_dir": str(builder.run_dir)})

        trainer.bus.subscribe(Event.STEP_END, report)
        trainer.fit()
    finally:
        builder.shutdown()


def plot_trials(results: Any, metric: str, keys: list[str], path: Path) -> None:
    """Every trial's metric against step, one line each, labelled by its parameters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i in range(len(results)):
        result = results[i]
        frame = result.metrics_dataframe
        if frame is None or metric not in frame:
            continue
        config = result.config or {}
        label = ", ".join(f"{k.removeprefix('config/').split('.')[-1]}={config.get(k.removeprefix('config/'))}" for k in keys)
        ax.plot(frame["step"], frame[metric].rolling(5, min_periods=1).mean(), label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{metric} (5-step mean)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    try:
        name, sweep, extra = load_sweep(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        console.print(f"config error: {err}", markup=False)
        return 2
    import ray
    from ray import tune

    base_cfg = load_config([f"experiment={sweep.experiment}", *sweep.overrides, *extra])
    out = Path(base_cfg.trainer.run_root).resolve() / "sweeps" / f"{name}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    base = [f"experiment={sweep.experiment}", *sweep.overrides, *extra, f"trainer.run_root={out / 'runs'}"]
    from toolbox.experiment import ray_init_kwargs

    if not ray.is_initialized():
        ray.init(**ray_init_kwargs(base_cfg))
    trainable = tune.with_resources(tune.with_parameters(run_trial, base=base, metric=sweep.metric),
                                    partial(trial_resources, base))
    tuner = tune.Tuner(trainable, param_space=tune_space(sweep),
                       tune_config=tune.TuneConfig(metric=SCORE, mode=sweep.mode, num_samples=sweep.num_samples,
                                                   max_concurrent_trials=sweep.max_concurrent_trials),
                       run_config=tune.RunConfig(name=name, storage_path=str(out / "tune"), verbose=0))
    results = tuner.fit()
    frame = results.get_dataframe()
    keys = [f"config/{k}" for k in sweep.param_space]
    frame.to_csv(out / "results.csv", index=False)
    table = Table(title=f"sweep {name}: {sweep.metric} (mean of the last 10% of steps), {sweep.mode}imised")
    for col in [k.removeprefix("config/") for k in keys] + [SCORE, "step", "run_dir"]:
        table.add_column(col)
    for _, row in frame.sort_values(SCORE, ascending=sweep.mode == "min").iterrows():
        table.add_row(*[str(row.get(k)) for k in keys], f"{row.get(SCORE):.3f}", str(row.get("step")), Path(str(row.get("run_dir"))).name)
    console.print(table)
    plot_trials(results, sweep.metric, keys, out / "sweep.png")
    best = results.get_best_result()
    console.print(f"best: {best.config}  {SCORE} {(best.metrics or {}).get(SCORE, float('nan')):.3f}\nresults: {out}")
    return 1 if results.num_errors else 0


if __name__ == "__main__":
    sys.exit(main())
