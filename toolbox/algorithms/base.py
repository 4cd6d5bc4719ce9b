"""The wiring shared by several algorithms (online policy loop, offline loop)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from toolbox.algorithms.pieces import DynamicSampling, GroupSampling
from toolbox.config.algorithm import AlgorithmConfig
from toolbox.core.events import EventBus
from toolbox.core.registry import Registry, Spec
from toolbox.data.prompts import PromptSource
from toolbox.rl.roles import PolicyLearnerRole, RewardRole, RolloutRole
from toolbox.trainers.base import BaseTrainer

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder
    from toolbox.engines.placement import SyncPath

Wiring = Callable[["ExperimentBuilder", EventBus], BaseTrainer]  # what `register_algorithm` decorates
log = logging.getLogger(__name__)


@dataclass
class PolicyRoles:
    """What an online policy algorithm's loop drives: rollout, reward and learner groups, and the prompts."""

    rollout: RolloutRole
    reward: RewardRole
    learner: PolicyLearnerRole
    prompts: PromptSource


def policy_roles(builder: ExperimentBuilder, learner_cls: type, algo: AlgorithmConfig) -> PolicyRoles:
    """Rollout workers, reward workers and a learner group of ``learner_cls`` ranks (built inside each rank's actor,
    after its process group exists, from ``learner_cls(model_path, dtype, learner_cfg, algo, total_steps)``)."""
    from toolbox.actors.reward import RewardWorker
    from toolbox.actors.roles import PolicyLearnerGroup, RewardGroup, RolloutGroup
    from toolbox.actors.rollout import RolloutWorker
    from toolbox.data.tasks import TASKS
    from toolbox.engines import ENGINES
    from toolbox.engines.placement import engine_weight_transfer
    c, path = builder.cfg, builder.model_path
    engine = partial(build_engine, ENGINES, c.rollout.engine, path, rollout_dtype(c), c.trainer.seed,
                     extra=engine_weight_transfer(c))
    # The learner first: its ranks are the longest to start (model, reference, process group), and the actors
    # created first take the worker processes Ray started ahead (one per CPU); the others wait for new ones.
    learner = PolicyLearnerGroup(builder.learner_group(
        partial(learner_cls, path, c.model.dtype, c.learner, algo, c.trainer.total_steps), wait=False))
    def reward_kwargs(r: int) -> dict[str, Any]:
        return dict(rank=r, spec=c.reward.spec, run=c.reward.run, model_path=path)

    hosted = c.reward.num_workers == 0  # the rollout workers score their own batches
    # Colocated: the engines finish starting (vLLM and SGLang measure the GPU's free memory and take their share)
    # before the learner ranks build and shard their models on the same GPUs, which they do when they join their
    # process group (`builder.started`); a learner loading meanwhile would shrink or fail the engines' profiling.
    rollout_group = builder.group(
        "rollout", RolloutWorker, c.rollout.num_workers,
        lambda r: dict(rank=r, build=engine, torch_threads=c.rollout.torch_threads,
                       scorer=partial(RewardWorker, **reward_kwargs(r)) if hosted else None),
        c.rollout.timeout_s, c.rollout.cpus_per_worker, c.rollout.gpus_per_worker,
        wait=c.rollout.placement == "colocate",
    )
    rollout = RolloutGroup(rollout_group)
    reward = RewardGroup(rollout_group if hosted else builder.group(
        "reward", RewardWorker, c.reward.num_workers, reward_kwargs, c.reward.timeout_s, c.reward.cpus_per_worker, 0.0,
        wait=False))
    # The driver's own start-up (the tokenizer) while the actors of every role start
    prompts = PromptSource(TASKS.build(c.task, inject={"data": c.data}), builder.tokenizer, c.trainer.seed)
    builder.started()  # every role's actors started at once; then the learner ranks join their process group
    return PolicyRoles(rollout, reward, learner, prompts)


def policy_wiring(builder: ExperimentBuilder, bus: EventBus, learner_cls: type, algo: GroupSampling,
                  dynamic: DynamicSampling | None = None) -> BaseTrainer:
    """`policy_roles` around the shared online policy loop."""
    from toolbox.trainers.online import OnlineTrainer

    assert isinstance(algo, AlgorithmConfig)
    c, roles = builder.cfg, policy_roles(builder, learner_cls, algo)
    sync = log_placement(builder).runs
    if sync == "shared_memory":
        from toolbox.actors.shared_sync import open_shared_sync

        open_shared_sync(roles.learner, roles.rollout, dtype=rollout_dtype(c))
    elif sync == "nccl":
        from toolbox.actors.device_sync import open_nccl_sync

        open_nccl_sync(roles.learner, roles.rollout, c.learner.bucket_mb << 20,
                       wire="sglang" if c.rollout.engine.name == "sglang" else "vllm", dtype=rollout_dtype(c))
    return OnlineTrainer(builder.trainer_config(), bus, algo, c.rollout.sampling, roles.prompts, roles.rollout,
                         roles.reward, roles.learner, builder.run_dir, c.experiment, dynamic=dynamic,
                         colocate=c.rollout.placement == "colocate", max_staleness=c.rollout.max_staleness,
                         steps_per_generation=c.rollout.steps_per_generation)


def log_placement(builder: ExperimentBuilder) -> SyncPath:
    """Once at start: the weight-sync path the placement calls for (from the nodes the actors landed on), and
    what a colocated learner keeps on its GPU while the engines generate. Returns that path."""
    from toolbox.engines.placement import choose_sync_path

    c = builder.cfg
    path = choose_sync_path(c, builder.nodes.get("learner"), builder.nodes.get("rollout"))
    log.info("%s", path.describe())
    if (c.rollout.placement == "colocate" and c.learner.gpus_per_worker and c.learner.offload == "none"
            and not c.learner.offload_while_generating):
        log.warning("rollout.placement: colocate with learner.offload: none: each learner rank keeps its shards, "
                    "gradients and AdamW state on the GPU while the engine generates; "
                    "learner.offload_while_generating: true moves them to host memory between the export and the next "
                    "update (learner.offload: params keeps them there for good)")
    return path


def rollout_dtype(cfg: Any) -> str:
    """The dtype the configured engines load the policy in (``rollout.dtype``, `toolbox.engines.common.engine_dtype`)."""
    from toolbox.engines.common import engine_dtype

    return engine_dtype(cfg.rollout.engine.name, cfg.rollout.dtype, cfg.model.dtype)


def build_engine(engines: Registry, spec: Spec, model_path: str, dtype: str, seed: int, rank: int,
                 extra: dict[str, Any] | None = None) -> Any:
    """Rollout worker ``rank``'s engine (each rank samples with its own seed); ``extra``: more injected arguments
    (`toolbox.engines.placement.engine_weight_transfer`)."""
    return engines.build(spec, inject={"model_path": model_path, "dtype": dtype, "seed": seed + 1000 * rank,
                                      **(extra or {})})


def offline_wiring(builder: ExperimentBuilder, bus: EventBus, learner_cls: type,
                   summary_metrics: tuple[str, ...] = ("loss",)) -> BaseTrainer:
    """A learner group of ``learner_cls`` ranks (each reads the dataset itself) driven by the offline loop."""
    from toolbox.actors.roles import OfflineLearnerGroup
    from toolbox.trainers.offline import OfflineTrainer

    c = builder.cfg
    build = partial(learner_cls, builder.model_path, c.model.dtype, c.learner, c.algorithm, c.trainer.total_steps,
                    c.task, c.trainer.seed)
    learner = OfflineLearnerGroup(builder.learner_group(build))
    return OfflineTrainer(builder.trainer_config(), bus, learner, builder.run_dir, c.experiment, summary_metrics)
