"""A sweep YAML (``configs/sweeps/NAME.yaml``) as a validated `SweepConfig`, and the `SweepJob` it becomes: a new sweep
directory, or the interrupted one ``resume=`` names. Every trial's config is loaded, so a bad value fails before any
trial starts."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolbox.config.loader import load_config, parse_overrides
from toolbox.config.schema import ExperimentConfig
from toolbox.core.errors import ConfigError
from toolbox.core.paths import CONFIG_DIR
from toolbox.core.registry import format_validation_error


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
