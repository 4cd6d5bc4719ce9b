"""Exact resume of the default recipe on a real local Ray: ``grpo_tiny`` samples blocks of 2 steps up to 3 steps ahead
of the learner, so at its checkpoint of step 6 the batches of steps 7 and 8 are already sampled, with weights older
than the checkpoint's. A run stopped right after that checkpoint and resumed with ``trainer.resume_from=auto`` must
train on those very batches (the checkpoint keeps them) and repeat the uninterrupted run's steps 7 and 8 bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests import stopped_runs
from tests.run_files import numbers
from toolbox.trainers.base import TRAINER_STATE

pytestmark = pytest.mark.integration

N, K = 8, 6
RUN = ["experiment=grpo_tiny", "callbacks=[]", "trainer.eval_every=0", "trainer.final_eval=false",
       f"trainer.total_steps={N}", f"trainer.save_every={K}"]


def fit(root: Path, name: str, *overrides: str, stop_at: int = 0) -> list[dict[str, float]]:
    return stopped_runs.fit([*RUN, f"trainer.run_root={root}", f"trainer.run_name={name}", *overrides], stop_at)


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
