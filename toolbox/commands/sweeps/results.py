"""What a finished sweep leaves: the ranked table, results.csv, sweep.png, every trial's dashboard overlaid, and
best.yaml (the best trial as an experiment); and whether Tune stopped before every trial ended."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from toolbox.commands.sweeps.config import SweepJob
from toolbox.commands.sweeps.trial import SCORE
from toolbox.config.loader import merge, parse_overrides
from toolbox.core.paths import experiment_path

# Overrides that say where a run goes, not what it is: left out of best.yaml.
PLACE_KEYS = ("trainer.run_root=", "trainer.run_name=", "trainer.resume_from=", "trainer.shared_fs=")


def nested(key: str, value: Any) -> dict[str, Any]:
    """``("a.b", 1)`` -> ``{"a": {"b": 1}}``."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def best_experiment(job: SweepJob, params: dict[str, Any]) -> dict[str, Any]:
    """The best trial as an experiment YAML's data: ``base:`` the sweep's experiment, then what the trial changed."""
    experiment = job.sweep.experiment
    base = experiment if not experiment.endswith((".yaml", ".yml")) else str(experiment_path(experiment).resolve())
    data: dict[str, Any] = {"base": base}
    data = merge(data, parse_overrides([a for a in [*job.sweep.overrides, *job.extra] if not a.startswith(PLACE_KEYS)]))
    for key, value in params.items():
        data = merge(data, nested(key, value))
    return data


def write_best(job: SweepJob, params: dict[str, Any], score: float) -> Path:
    path = job.out / "best.yaml"
    header = (f"# The best trial of sweep {job.name} ({job.sweep.metric}, mean of the last 10% of steps: {score:.4g}).\n"
              f"# Run it: toolbox run experiment={path}\n")
    path.write_text(header + yaml.safe_dump(best_experiment(job, params), sort_keys=False))
    return path


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


def interrupted(job: SweepJob) -> bool:
    """Whether Tune stopped before every trial of the space ended (Tune's statuses cannot tell: it marks the
    trials it stops on an interrupt TERMINATED, as it does the finished ones)."""
    from toolbox.commands.sweeps.state import TrialsEnded

    sweep = job.sweep
    grids = [len(values) for spec in sweep.param_space.values() for kind, values in spec.items() if kind == "grid"]
    return len(TrialsEnded(job.out / "ended.json").ended()) < sweep.num_samples * math.prod(grids)


def write_results(job: SweepJob, results: Any, console: Any) -> None:
    """The ranked table, results.csv, sweep.png and best.yaml."""
    from rich.table import Table

    sweep, out = job.sweep, job.out
    frame = results.get_dataframe()
    keys = [f"config/{k}" for k in sweep.param_space]
    frame.to_csv(out / "results.csv", index=False)
    table = Table(title=f"sweep {job.name}: {sweep.metric} (mean of the last 10% of steps), {sweep.mode}imised")
    for col in [k.removeprefix("config/") for k in keys] + [SCORE, "step", "run_dir"]:
        table.add_column(col)
    for _, row in frame.sort_values(SCORE, ascending=sweep.mode == "min").iterrows():
        table.add_row(*[str(row.get(k)) for k in keys], f"{row.get(SCORE):.3f}", str(row.get("step")), Path(str(row.get("run_dir"))).name)
    console.print(table)
    plot_trials(results, sweep.metric, keys, out / "sweep.png")
    # Every trial's dashboard, overlaid: reward, loss, KL, response length, step time.
    from toolbox.callbacks.plots import plot_runs

    trial_dirs = {Path(str(d)) for d in (frame["run_dir"].dropna() if "run_dir" in frame else [])}
    plot_runs(sorted(d for d in trial_dirs if (d / "metrics.jsonl").is_file()), out / "dashboard.png", f"sweep {job.name}")
    best = results.get_best_result()
    score = (best.metrics or {}).get(SCORE, float("nan"))
    path = write_best(job, best.config or {}, score)
    console.print(f"best: {best.config}  {SCORE} {score:.3f}\nbest experiment: {path}\nresults: {out}")
