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
ones continue from their last checkpoint, and ASHA keeps its rungs (`toolbox.commands.tune_state`).

Results in ``<run_root>/sweeps/<name>-<time>/``: a ranked table in the console,
``results.csv``, ``sweep.png``, and ``best.yaml``, the best trial as an experiment
(``base:`` the sweep's experiment plus what the trial changed) for
``toolbox run experiment=<sweep dir>/best.yaml``.

Each trial reserves one placement group: a bundle for its driver, then one per actor of
its experiment (`toolbox.driver.placement.trial_bundles`); the experiment's worker groups are
placed in those bundles, so Tune schedules whole experiments and never over-commits.
Python API: `toolbox_trainable` wraps the same trainable for a `ray.tune.Tuner` of your own
(docs/examples/tune_api.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolbox.config.loader import load_config, merge, parse_overrides
from toolbox.config.schema import ExperimentConfig
from toolbox.core.errors import ConfigError
from toolbox.core.paths import CONFIG_DIR, experiment_path
from toolbox.core.registry import format_validation_error

SCORE = "score"
INTERRUPTED = 130  # exit code of an interrupted sweep, as a shell reports a Ctrl+C
# Overrides that say where a run goes, not what it is: left out of best.yaml.
PLACE_KEYS = ("trainer.run_root=", "trainer.run_name=", "trainer.resume_from=", "trainer.shared_fs=")


class SchedulerConfig(BaseModel):
    """When Tune stops trials early."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["fifo", "asha"] = Field("fifo", description="fifo: every trial runs to the end; asha: "
                                          "asynchronous successive halving on the score at each step.")
    grace_period: int = Field(1, ge=1, description="ASHA: steps every trial runs before it may be stopped.")
    reduction_factor: float = Field(2.0, gt=1, description="ASHA: rungs at grace_period * reduction_factor^k steps; "
                                    "a trial below the top 1/reduction_factor at a rung stops.")
    max_t: int = Field(0, ge=0, description="ASHA: the most steps a trial runs (0: the experiment's trainer.total_steps).")


class SearchConfig(BaseModel):
    """How Tune picks the parameters of the next trial."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["basic", "optuna"] = Field("basic", description="basic: grid and random variants; optuna: "
                                             "Optuna's TPE sampler (choice/uniform/loguniform only; pip install optuna).")
    seed: int | None = Field(None, description="Seed of the optuna sampler (None: random).")


class SweepConfig(BaseModel):
    """A sweep: a base experiment, what varies, what is optimised, when trials stop early."""

    model_config = ConfigDict(extra="forbid")
    experiment: str = Field(description="Base experiment (configs/experiments/NAME.yaml, or a YAML path).")
    overrides: list[str] = Field(default_factory=list, description="Dotted overrides every trial gets.")
    param_space: dict[str, dict[str, list[float | int | str]]] = Field(description="Dotted path -> {grid|choice|uniform|loguniform: values}.")
    metric: str = Field("reward", description="Step metric to optimise (mean over the last 10% of steps).")
    mode: str = Field("max", pattern="^(max|min)$", description="Maximise or minimise the metric.")
    num_samples: int = Field(1, ge=1, description="Samples of the space (repeats of the grid; trials of optuna).")
    max_concurrent_trials: int = Field(1, ge=1, description="Trials running at once.")
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig, description="Early stopping (fifo or asha).")
    search: SearchConfig = Field(default_factory=SearchConfig, description="Search algorithm (basic or optuna).")
    keep_checkpoints: int = Field(2, ge=1, description="Tune checkpoints kept per trial (the newest).")


@dataclass
class SweepJob:
    """A sweep ready to run: its name, config, the overrides every trial gets, and its directory."""

    name: str
    sweep: SweepConfig
    extra: list[str]
    out: Path
    resume: bool = False

    @property
    def base(self) -> list[str]:
        """The overrides of every trial (the parameters of a trial come on top)."""
        return [f"experiment={self.sweep.experiment}", *self.sweep.overrides, *self.extra,
                f"trainer.run_root={self.out / 'runs'}"]


def sweep_configs(sweep: SweepConfig, extra: list[str]) -> Iterator[ExperimentConfig]:
    """The base config, then one per listed value of each parameter (bounds of uniform ranges included)."""
    base = [f"experiment={sweep.experiment}", *sweep.overrides, *extra]
    yield load_config(base)
    for key, spec in sweep.param_space.items():
        for value in next(iter(spec.values())):
            yield load_config([*base, f"{key}={value}"])


def load_sweep(args: list[str]) -> tuple[str, SweepConfig, list[str]]:
    """``sweep=NAME`` plus extra overrides for every trial; fails on a bad sweep or a bad trial config."""
    flat = parse_overrides(args)
    name = str(flat.pop("sweep", ""))
    path = Path(name) if name.endswith((".yaml", ".yml")) else CONFIG_DIR / "sweeps" / f"{name}.yaml"
    name = path.stem
    if not name or not path.exists():
        known = sorted(p.stem for p in (CONFIG_DIR / "sweeps").glob("*.yaml"))
        raise ConfigError(f"sweep={name or '?'}: no {path}; known sweeps: {known}")
    try:
        sweep = SweepConfig.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as err:
        raise ConfigError(f"{path}: " + format_validation_error(err, "")) from None
    extra = [a for a in args if not a.startswith(("sweep=", "resume="))]
    for key, spec in sweep.param_space.items():
        if len(spec) != 1 or next(iter(spec)) not in {"grid", "choice", "uniform", "loguniform"}:
            raise ConfigError(f"{path}: param_space.{key}: give one of grid/choice/uniform/loguniform, got {spec}")
        if sweep.search.name == "optuna" and "grid" in spec:
            raise ConfigError(f"{path}: param_space.{key}: search optuna samples and cannot take a grid; use choice")
    # Every value must make a valid experiment, checked before any trial starts.
    total_steps = [cfg.trainer.total_steps for cfg in sweep_configs(sweep, extra)][0]
    if sweep.scheduler.grace_period > (sweep.scheduler.max_t or total_steps):
        raise ConfigError(f"{path}: scheduler.grace_period={sweep.scheduler.grace_period} is more than the "
                          f"{sweep.scheduler.max_t or total_steps} steps a trial runs")
    return name, sweep, extra


def prepare(args: list[str]) -> SweepJob:
    """The sweep to run: a new one (``<run_root>/sweeps/<name>-<time>``), or the one ``resume=`` names."""
    resume = str(parse_overrides(args).get("resume", "false"))
    name, sweep, extra = load_sweep(args)
    root = Path(load_config([f"experiment={sweep.experiment}", *sweep.overrides, *extra]).trainer.run_root).resolve()
    if resume.lower() in {"false", "no", "0", ""}:
        return SweepJob(name, sweep, extra, root / "sweeps" / f"{name}-{dt.datetime.now():%Y%m%d-%H%M%S}")
    if resume.lower() in {"true", "yes", "1"}:
        found = sorted((root / "sweeps").glob(f"{name}-*/sweep.json"))
        if not found:
            raise ConfigError(f"resume=true: no sweep {name!r} under {root / 'sweeps'} to resume; start it without resume")
        out = found[-1].parent
    else:
        out = Path(resume).resolve()
        if not (out / "sweep.json").is_file():
            raise ConfigError(f"resume={resume}: not a sweep directory (no sweep.json)")
    saved = json.loads((out / "sweep.json").read_text())
    if sorted(saved["extra"]) != sorted(extra):
        raise ConfigError(f"resume: {out} ran with the overrides {saved['extra']}, not {extra}: a resumed sweep "
                          "keeps the overrides it started with")
    return SweepJob(saved["name"], SweepConfig.model_validate(saved["sweep"]), saved["extra"], out, resume=True)


def tune_space(sweep: SweepConfig) -> dict[str, Any]:
    from ray import tune

    makers = {"grid": tune.grid_search, "choice": tune.choice,
              "uniform": lambda v: tune.uniform(*v), "loguniform": lambda v: tune.loguniform(*v)}
    return {key: makers[kind](values) for key, spec in sweep.param_space.items() for kind, values in spec.items()}


def trial_args(base: list[str], params: dict[str, Any]) -> list[str]:
    return [*base, *(f"{k}={v}" for k, v in params.items())]


def trial_resources(base: list[str], params: dict[str, Any]) -> Any:
    """One placement group per trial: its driver's bundle, then a bundle for every actor of its experiment."""
    from ray.tune import PlacementGroupFactory

    from toolbox.driver.placement import trial_bundles

    cfg = load_config(trial_args(base, params))
    return PlacementGroupFactory([{"CPU": 0.01}] if cfg.ray.local_mode else trial_bundles(cfg))


class TrialReporter:
    """Reports each step's metrics and score to Tune, with the checkpoint the step saved (if it saved one).

    A step's checkpoint is written after its STEP_END event, so each report waits for the next event.
    """

    def __init__(self, metric: str, run_dir: Path) -> None:
        self.metric, self.run_dir = metric, run_dir
        self.history: list[float] = []
        self.pending: dict[str, Any] | None = None

    def step_end(self, _: Any, payload: dict[str, Any]) -> None:
        self.flush()
        self.history.append(float(payload["metrics"].get(self.metric, float("nan"))))
        k = max(1, len(self.history) // 10)
        self.pending = {**payload["metrics"], "step": payload["step"], SCORE: sum(self.history[-k:]) / k,
                        "run_dir": str(self.run_dir)}

    def saved(self, _: Any, payload: dict[str, Any]) -> None:
        from ray import tune

        if self.pending is not None and self.pending["step"] == payload["step"]:
            metrics, self.pending = self.pending, None
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(payload["path"]))

    def flush(self, *_: Any) -> None:
        from ray import tune

        if self.pending is not None:
            metrics, self.pending = self.pending, None
            tune.report(metrics)


def run_trial(params: dict[str, Any], base: list[str], metric: str) -> None:
    """One trial: the whole experiment in ``runs/<trial name>``, every step's metrics reported to Tune;
    a restored trial continues from the checkpoint Tune hands it."""
    import ray
    from ray import tune

    from toolbox.core.events import Event
    from toolbox.driver.experiment import ExperimentBuilder

    checkpoint = tune.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else contextlib.nullcontext("") as resume:
        run = [f"trainer.run_name={tune.get_context().get_trial_name()}", "callbacks=[{name: jsonl}]",
               *([f"trainer.resume_from={resume}"] if resume else [])]
        cfg = load_config([*trial_args(base, params), *run])
        builder = ExperimentBuilder(cfg)
        if not cfg.ray.local_mode:  # the trial's actors live in bundles of the trial's placement group
            builder.use_placement_group(ray.util.get_current_placement_group())
        try:
            trainer = builder.build_trainer()
            reporter = TrialReporter(metric, builder.run_dir)
            trainer.bus.subscribe(Event.STEP_END, reporter.step_end)
            trainer.bus.subscribe(Event.CHECKPOINT_SAVED, reporter.saved)
            trainer.fit()
            reporter.flush()
        finally:
            builder.shutdown()


def toolbox_trainable(base: list[str], metric: str = "reward") -> Any:
    """The Tune trainable of whole experiments: ``base`` overrides (``experiment=NAME`` first), each trial's
    ``param_space`` entries (dotted config paths) on top, each trial in its own placement group."""
    from ray import tune

    return tune.with_resources(tune.with_parameters(run_trial, base=base, metric=metric),
                               partial(trial_resources, base))


def make_scheduler(sweep: SweepConfig, total_steps: int, state_path: Path) -> Any:
    from ray.tune.schedulers import FIFOScheduler

    from toolbox.commands.tune_state import ResumableASHA

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

    from toolbox.commands.tune_state import TrialsEnded

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
    from toolbox.commands.tune_state import TrialsEnded

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
    from toolbox.commands.plot import plot_runs

    trial_dirs = {Path(str(d)) for d in (frame["run_dir"].dropna() if "run_dir" in frame else [])}
    plot_runs(sorted(d for d in trial_dirs if (d / "metrics.jsonl").is_file()), out / "dashboard.png", f"sweep {job.name}")
    best = results.get_best_result()
    score = (best.metrics or {}).get(SCORE, float("nan"))
    path = write_best(job, best.config or {}, score)
    console.print(f"best: {best.config}  {SCORE} {score:.3f}\nbest experiment: {path}\nresults: {out}")


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
