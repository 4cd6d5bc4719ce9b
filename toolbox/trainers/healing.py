"""A learner rank that dies mid-run: every rank started anew, the newest complete checkpoint loaded, the steps
since it redone. Rollout and reward workers heal on their own (Ray restarts them, `toolbox.actors.supervisor`);
learner ranks cannot come back one at a time (they share a process group and hold shards of one model), so the
loop restarts them as a group, bounded by ``learner.max_restarts``.

Not covered: a death outside a training step (during a checkpoint save or an evaluation) fails the run; the
redone steps' metrics are not reported twice (the first report stands; the redo follows the same prompts and,
as a resume from that checkpoint does, the same numbers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from toolbox.core.errors import WorkerError
from toolbox.trainers.checkpoints import latest_checkpoint
from toolbox.trainers.roles import Metrics

if TYPE_CHECKING:
    from toolbox.trainers.online import OnlineTrainer

log = logging.getLogger(__name__)


def step_with_restarts(trainer: OnlineTrainer, step: int, run_step: Callable[[int], Metrics]) -> Metrics:
    """``run_step(step)``, recovering from learner deaths while ``trainer.learner.restart()`` allows; adds the
    restart counts of every role (``rollout_restarts``, ``reward_restarts``, ``learner_restarts``)."""
    start = step
    while True:
        try:
            for redo in range(start, step):  # after a restart: the steps since the checkpoint (already reported)
                run_step(redo)
            metrics = run_step(step)
            break
        except WorkerError as err:
            if err.role != "learner" or not trainer.learner.restart():
                raise
            start = resume_latest(trainer, err)
    metrics["rollout_restarts"] = float(trainer.rollout.restarts())
    metrics["reward_restarts"] = float(trainer.reward.restarts())
    metrics["learner_restarts"] = float(trainer.learner.restarts())
    return metrics


def resume_latest(trainer: OnlineTrainer, err: WorkerError) -> int:
    """Load the run's newest complete checkpoint into the new ranks (learner and role states) and sync the
    engines' weights to it; returns its step (0 without a checkpoint: the ranks start from the initial model)."""
    latest = latest_checkpoint(trainer.run_dir)
    log.warning("%s; every learner rank was restarted and continues from %s", err,
                latest if latest else "the initial model (no complete checkpoint yet)")
    trainer.cfg = trainer.cfg.model_copy(update={"resume_from": str(latest) if latest else ""})
    return trainer.prepare()
