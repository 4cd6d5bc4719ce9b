"""Wiring shared by the offline recipes (SFT, DPO): one learner group, no rollout or reward workers."""

from __future__ import annotations

from functools import partial
from typing import Any

from toolbox.core.events import EventBus


def offline_recipe(builder: Any, bus: EventBus, learner_cls: type, trainer_cls: type) -> Any:
    """A learner group of ``learner_cls`` ranks (each reads the dataset itself) driven by ``trainer_cls``."""
    c = builder.cfg
    build = partial(learner_cls, builder.model_path, c.model.dtype, c.learner, c.algorithm, c.trainer.total_steps,
                    c.task, c.trainer.seed)
    learner = builder.learner_group(build)
    return trainer_cls(builder.trainer_config(), bus, learner, builder.run_dir, c.experiment)
