"""A learner rank that dies mid-run: every rank started anew, the newest complete checkpoint loaded, the steps
since it redone. Rollout and reward workers heal on their own (Ray restarts them, `toolbox.actors.supervisor`);
learner ranks cannot come back one at a time (they share a process group and hold shards of one model), so the
loop restarts them as a group, bounded by ``learner.max_restarts``.

A death during a checkpoint save is survived the same way (the half-written ``step_N.tmp`` is never chosen: the
steps since the newest complete checkpoint are redone and the save tried again); one during an evaluation (which
runs on the rollout and reward workers) surfaces at the next step's update. The redone steps' metrics are not
reported twice (the first report stands; the redo follows the same prompts and, as a resume from that checkpoint
does, the same numbers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from toolbox.core.errors import WorkerError
from toolbox.rl.roles import Metrics
from toolbox.trainers.checkpoints import newest_checkpoint, remote_run

if TYPE_CHECKING:
    from toolbox.trainers.online import OnlineTrainer

log = logging.getLogger(__name__)
T = TypeVar("T")


def with_restarts(trainer: OnlineTrainer, step: int, run_step: Callable[[int], Metrics], action: Callable[[], T]) -> T:
    """``action()`` once steps ``0..step-1`` are done, recovering from learner deaths while
    ``trainer.learner.restart()`` allows: the group restarts from the newest complete checkpoint, ``run_step``
    redoes the steps since it, and ``action`` is tried again."""
    start = step
    while True:
        try:
            for redo in range(start, step):  # after a restart: the steps since the checkpoint (already reported)
                run_step(redo)
            return action()
        except WorkerError as err:
            if err.role != "learner" or not trainer.learner.restart():
                raise
            start = resume_latest(trainer, err)


def step_with_restarts(trainer: OnlineTrainer, step: int, run_step: Callable[[int], Metrics]) -> Metrics:
    """``run_step(step)`` under `with_restarts`; adds the restart counts of every role (``rollout_restarts``,
    ``reward_restarts``, ``learner_restarts``)."""
    metrics = with_restarts(trainer, step, run_step, lambda: run_step(step))
    counted: dict[int, float] = {}  # per worker group: roles sharing one (reward.num_workers: 0) ask once
    for name, role in (("rollout", trainer.rollout), ("reward", trainer.reward), ("learner", trainer.learner)):
        group = id(getattr(role, "group", role))
        if group not in counted:
            counted[group] = float(role.restarts())
        metrics[f"{name}_restarts"] = counted[group]
    return metrics


def resume_latest(trainer: OnlineTrainer, err: WorkerError) -> int:
    """Load the run's newest complete checkpoint into the new ranks (learner and role states) and sync the
    engines' weights to it; returns its step (0 without a checkpoint: the ranks start from the initial model)."""
    latest = newest_checkpoint(trainer.run_dir, remote_run(trainer.cfg, trainer.run_dir))
    log.warning("%s; every learner rank was restarted and continues from %s", err,
                latest or "the initial model (no complete checkpoint yet)")
    trainer.cfg = trainer.cfg.model_copy(update={"resume_from": latest})
    return trainer.prepare()
