"""Running an experiment in this process, optionally stopped right after one of its checkpoints (as a driver killed
there would be): shared by the tests that resume a run and compare it with an uninterrupted one."""

from __future__ import annotations

import contextlib
from typing import Any

from toolbox.config import load_config
from toolbox.core.events import Event
from toolbox.driver.experiment import ExperimentBuilder


class Stopped(Exception):
    """A run's end right after its checkpoint of the step asked for."""


def fit(overrides: list[str], stop_at: int = 0) -> list[dict[str, float]]:
    """The step metrics of the run ``overrides`` describe; with ``stop_at``, it stops once that step's checkpoint is
    complete (and published, for a remote run: the publishing callback is subscribed before this one)."""
    builder = ExperimentBuilder(load_config(overrides))
    try:
        trainer = builder.build_trainer()

        def stop(_: Event, payload: dict[str, Any]) -> None:
            if payload["step"] == stop_at:
                raise Stopped

        trainer.bus.subscribe(Event.CHECKPOINT_SAVED, stop)
        with contextlib.suppress(Stopped):
            trainer.fit()
        return list(trainer.history)
    finally:
        builder.shutdown()
