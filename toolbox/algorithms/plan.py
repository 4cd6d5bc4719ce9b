"""What an algorithm's wiring returns: a declarative `AlgorithmPlan` of its run, which the builder carries out.

The wiring reads the config and says what the run is made of: the learner ranks (the factory each rank builds its
learner with, once its process group exists), the other roles' workers (worker class, count, constructor arguments,
resources) and the loop that drives them. It starts nothing. `toolbox.driver.experiment.ExperimentBuilder.start`
starts every group (the learner's first, all of them at once), waits for them once, joins the learner ranks into
their process group, opens the weight-sync path from the learner to the rollout workers where the plan has them
(object store, shared memory or NCCL, as the placement calls for: `toolbox.engines.placement.choose_sync_path`),
and only then calls the plan's loop factory with the typed groups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolbox.core.events import EventBus
from toolbox.trainers.base import BaseTrainer

Groups = dict[str, Any]  # role name -> its typed group (`toolbox.actors.roles`), as the loop factory receives them


@dataclass(frozen=True)
class Workers:
    """``count`` actors of ``cls``, worker ``r`` built from ``kwargs(r)``, each with ``cpus`` and ``gpus``; a call to
    one that runs past ``timeout_s`` fails the run. ``wait``: their constructors finish before the next role's
    actors are created (colocated engines profile the GPU's free memory before anything else loads on it)."""

    cls: type
    count: int
    kwargs: Callable[[int], dict[str, Any]]
    timeout_s: float
    cpus: float
    gpus: float = 0.0
    wait: bool = False


@dataclass(frozen=True)
class RolePlan:
    """One role of the run: its workers, or (``workers`` None) the workers of the earlier role ``on`` serving this
    role too (rollout workers that score their own batches); ``facade`` types the group for the loop."""

    name: str
    facade: Callable[[Any], Any]
    workers: Workers | None = None
    on: str = ""


@dataclass(frozen=True)
class LearnerPlan:
    """The learner ranks: ``build()`` makes one rank's learner inside its actor after the rank joined its process
    group (FSDP needs the group first); ``facade`` types the group for the loop."""

    build: Callable[[], Any]
    facade: Callable[[Any], Any]


@dataclass(frozen=True)
class AlgorithmPlan:
    """A run as its algorithm declares it: the learner, the other roles in the order their actors are created, and
    ``loop(groups, bus)``, the trainer, made once every group has started and the weight-sync path is open.
    Every plan with a ``rollout`` role gets the learner's weights synced to it."""

    learner: LearnerPlan
    loop: Callable[[Groups, EventBus], BaseTrainer]
    roles: tuple[RolePlan, ...] = field(default=())
