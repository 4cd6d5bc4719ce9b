"""The plans shared by several algorithms: the online policy roles (rollout, reward, learner) around any loop or
the shared online loop, and a learner alone driven by the offline loop (`toolbox.algorithms.plan`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from toolbox.algorithms.pieces import DynamicSampling, GroupSampling
from toolbox.algorithms.plan import AlgorithmPlan, Groups, LearnerPlan, RolePlan, Workers
from toolbox.config.algorithm import AlgorithmConfig
from toolbox.core.events import EventBus
from toolbox.core.registry import Registry, Spec
from toolbox.data.prompts import PromptSource
from toolbox.rl.roles import PolicyLearnerRole, RewardRole, RolloutRole
from toolbox.trainers.base import BaseTrainer

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder

Wiring = Callable[["ExperimentBuilder"], AlgorithmPlan]  # what `register_algorithm` decorates


@dataclass
class PolicyRoles:
    """What an online policy algorithm's loop drives: rollout, reward and learner groups, and the prompts."""

    rollout: RolloutRole
    reward: RewardRole
    learner: PolicyLearnerRole
    prompts: PromptSource


PolicyLoop = Callable[[PolicyRoles, EventBus], BaseTrainer]


def policy_plan(builder: ExperimentBuilder, learner_cls: type, algo: AlgorithmConfig, loop: PolicyLoop) -> AlgorithmPlan:
    """Rollout workers, reward workers (or the rollout workers scoring their own batches, ``reward.num_workers: 0``)
    and a learner group of ``learner_cls`` ranks (each built inside its actor, after its process group exists, as
    ``learner_cls(model_path, dtype, learner_cfg, algo, total_steps)``); ``loop`` gets them typed, with the task's
    prompts."""
    from toolbox.actors.reward import RewardWorker
    from toolbox.actors.roles import PolicyLearnerGroup, RewardGroup, RolloutGroup
    from toolbox.actors.rollout import RolloutWorker
    from toolbox.data.tasks import TASKS
    from toolbox.engines import ENGINES
    from toolbox.engines.placement import engine_weight_transfer

    c, path = builder.cfg, builder.model_path
    adapters = c.learner.lora is not None and c.learner.lora.sync == "adapter"  # the engine gets LoRA adapters
    engine = partial(build_engine, ENGINES, c.rollout.engine, path, rollout_dtype(c), c.trainer.seed,
                     extra={**engine_weight_transfer(c), "adapters": adapters})

    def reward_kwargs(r: int) -> dict[str, Any]:
        return dict(rank=r, spec=c.reward.spec, run=c.reward.run, model_path=path)

    hosted = c.reward.num_workers == 0  # the rollout workers score their own batches
    # Colocated: the engines finish starting (vLLM and SGLang measure the GPU's free memory and take their share)
    # before the learner ranks build and shard their models on the same GPUs, which they do when they join their
    # process group; a learner loading meanwhile would shrink or fail the engines' profiling.
    rollout = Workers(RolloutWorker, c.rollout.num_workers,
                      lambda r: dict(rank=r, build=engine, torch_threads=c.rollout.torch_threads,
                                     scorer=partial(RewardWorker, **reward_kwargs(r)) if hosted else None),
                      c.rollout.timeout_s, c.rollout.cpus_per_worker, c.rollout.gpus_per_worker,
                      wait=c.rollout.placement == "colocate")
    reward = None if hosted else Workers(RewardWorker, c.reward.num_workers, reward_kwargs, c.reward.timeout_s,
                                         c.reward.cpus_per_worker)

    def typed(groups: Groups, bus: EventBus) -> BaseTrainer:
        prompts = PromptSource(TASKS.build(c.task, inject={"data": c.data}), builder.tokenizer, c.trainer.seed)
        return loop(PolicyRoles(groups["rollout"], groups["reward"], groups["learner"], prompts), bus)

    return AlgorithmPlan(
        LearnerPlan(partial(learner_cls, path, c.model.dtype, c.learner, algo, c.trainer.total_steps),
                    PolicyLearnerGroup),
        typed,
        (RolePlan("rollout", RolloutGroup, rollout), RolePlan("reward", RewardGroup, reward, on="rollout")),
    )


def online_plan(builder: ExperimentBuilder, learner_cls: type, algo: GroupSampling,
                dynamic: DynamicSampling | None = None) -> AlgorithmPlan:
    """`policy_plan` around the shared online policy loop."""
    from toolbox.trainers.online import OnlineTrainer

    assert isinstance(algo, AlgorithmConfig)
    c = builder.cfg

    def loop(roles: PolicyRoles, bus: EventBus) -> BaseTrainer:
        return OnlineTrainer(builder.trainer_config(), bus, algo, c.rollout.sampling, roles.prompts, roles.rollout,
                             roles.reward, roles.learner, builder.run_dir, c.experiment, dynamic=dynamic,
                             colocate=c.rollout.placement == "colocate", max_staleness=c.rollout.max_staleness,
                             steps_per_generation=c.rollout.steps_per_generation)

    return policy_plan(builder, learner_cls, algo, loop)


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


def offline_plan(builder: ExperimentBuilder, learner_cls: type,
                 summary_metrics: tuple[str, ...] = ("loss",)) -> AlgorithmPlan:
    """A learner group of ``learner_cls`` ranks (each reads the dataset itself) driven by the offline loop."""
    from toolbox.actors.roles import OfflineLearnerGroup
    from toolbox.trainers.offline import OfflineTrainer

    c = builder.cfg
    build = partial(learner_cls, builder.model_path, c.model.dtype, c.learner, c.algorithm, c.trainer.total_steps,
                    c.task, c.trainer.seed)
    return AlgorithmPlan(LearnerPlan(build, OfflineLearnerGroup), lambda groups, bus: OfflineTrainer(
        builder.trainer_config(), bus, groups["learner"], builder.run_dir, c.experiment, summary_metrics))
