"""Exact resume of the default recipe on a real local Ray: ``grpo_tiny`` samples blocks of 2 steps up to 3 steps ahead
of the learner, so at its checkpoint of step 6 the batches of steps 7 and 8 are already sampled, with weights older
than the checkpoint's. A run stopped right after that checkpoint and resumed with ``trainer.resume_from=auto`` must
train on those very batches (the checkpoint keeps them) and repeat the uninterrupted run's steps 7 and 8 bit for bit.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.run_files import numbers
from toolbox.config import load_config
from toolbox.core.events import Event
from toolbox.experiment import ExperimentBuilder
from toolbox.trainers.base import TRAINER_STATE

pytestmark = pytest.mark.integration

N, K = 8, 6
RUN = ["experiment=grpo_tiny", "callbacks=[]", "trainer.eval_every=0", "trainer.final_eval=false",
       f"trainer.total_steps={N}", f"trainer.save_every={K}"]


class Stopped(Exception):
    """The first life's end, right after its checkpoint (as a driver killed there)."""


def fit(root: Path, name: str, *overrides: str, stop_at: int = 0) -> list[dict[str, float]]:
    """The run's step metrics; with ``stop_at``, the driver stops once that step's checkpoint is complete."""
    builder = ExperimentBuilder(load_config([*RUN, f"trainer.run_root={root}", f"trainer.run_name={name}", *overrides]))
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


def test_default_recipe_resumed_with_batches_in_flight_repeats_the_run(ray_session: None, tmp_path: Path) -> None:
    whole = fit(tmp_path, "whole")
    first = fit(tmp_path, "stopped", stop_at=K)
    assert len(first) == K
    state = torch.load(tmp_path / "stopped" / "checkpoints" / f"step_{K}" / TRAINER_STATE, weights_only=False)
    assert sorted(state["state"]["ahead"]) == [K, K + 1], "the checkpoint does not hold the batches sampled ahead"
    resumed = fit(tmp_path, "stopped", "trainer.resume_from=auto")
    assert len(resumed) == N - K
    assert [m["staleness"] for m in resumed] == [m["staleness"] for m in whole[K:]]
    for step, (want, got) in enumerate(zip(whole[K:], resumed), start=K + 1):
        assert numbers(got) == numbers(want), f"step {step} differs after resuming from step {K}"
