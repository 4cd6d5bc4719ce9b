"""One trial of a sweep: a whole experiment in its own placement group and run directory, every step's metrics and
score reported to Tune with the checkpoint the step saved (`toolbox_trainable`, also for a `Tuner` of your own)."""

from __future__ import annotations

import contextlib
from functools import partial
from pathlib import Path
from typing import Any

from toolbox.config.loader import load_config

SCORE = "score"


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
