"""`ExperimentConfig`: every section of an experiment, validated before any actor starts.

Each component's own options live next to the component (``SamplingConfig`` in
engines, ``LearnerConfig`` in learner, ...); this module composes them and checks
what spans sections: the batch arithmetic and the strategy's rank count. A section
that selects a registry entry (``algorithm``, ``task``, ``rollout.engine``,
``reward.spec``, ``callbacks[i]``) is typed by the entry its ``name`` picks, so a
field the entry does not take is an error naming its path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    field_validator,
    model_validator,
)

from toolbox.callbacks import CALLBACKS
from toolbox.config.algorithm import ALGORITHMS, DEFAULT_ALGORITHM, AlgorithmConfig
from toolbox.config.trainer import TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.core.paths import DEFAULT_EXPERIMENT
from toolbox.core.registry import Spec, SpecOf
from toolbox.data.check import check_data
from toolbox.data.rows import DataConfig
from toolbox.data.tasks import TASKS
from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.engines.common import check_engine_gpus
from toolbox.engines.placement import Placement, check_colocation
from toolbox.envs.config import EnvConfig
from toolbox.learner.config import LearnerConfig
from toolbox.learner.lora import check_adapter_sync
from toolbox.models.loading import ModelConfig
from toolbox.rewards.base import REWARDS
from toolbox.rewards.runner import RewardRunConfig

ENGINE = SpecOf(ENGINES, default="hf")
REWARD = SpecOf(REWARDS, default="math")
TASK = SpecOf(TASKS, default="digit_add")
CALLBACK = SpecOf(CALLBACKS)
DEFAULT_CALLBACKS = ("console", "jsonl", "tensorboard", "curves")


def algorithm_config(section: Any) -> AlgorithmConfig:
    """The registered config class named by ``section['name']`` (default grpo), validating the section.

    This is the config union, built from the algorithm registry: a plugin's algorithm needs no edit here.
    """
    if isinstance(section, AlgorithmConfig):
        return section
    config = ALGORITHMS.parse(section, default=DEFAULT_ALGORITHM)
    assert isinstance(config, AlgorithmConfig), f"algorithm {config!r} registered no AlgorithmConfig class"
    return config


class RolloutConfig(BaseModel):
    """Rollout workers: how many, which engine, how they sample."""

    model_config = ConfigDict(extra="forbid")
    num_workers: int = Field(1, ge=1, description="Rollout worker actors; prompts are split across them.")
    engine: Annotated[SerializeAsAny[Spec], ENGINE] = Field(
        default_factory=ENGINE.make_default, description="Generation engine: `name` selects it (default hf), "
        "the rest are its options.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling for training rollouts.")
    cpus_per_worker: float = Field(0.25, gt=0, description="Ray CPUs reserved per rollout worker.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype the engines load the policy in, independent of the learner's model.dtype (the "
        "weight sync casts to it). auto: bfloat16 for the GPU engines (vllm, sglang: flash attention takes "
        "half precision only), model.dtype for the others.")
    torch_threads: int = Field(1, ge=1, description="torch intra-op threads per rollout worker (real CPU use; "
                               "cpus_per_worker is Ray's logical reservation).")
    gpus_per_worker: float = Field(0.0, ge=0, description="Ray GPUs reserved per rollout worker.")
    timeout_s: float = Field(300.0, gt=0, description="Longest a rollout call may take before the run fails.")
    max_restarts: int = Field(3, ge=0, description="Times Ray restarts a rollout worker whose process died, per worker; "
                              "the new one reloads the weights its predecessor had and redoes its share of the step "
                              "(counted in the rollout_restarts metric). 0: a dead worker fails the run.")
    placement: Placement = Field("split", description="'split': rollout workers and learner ranks each have their own "
                                 "placement group. 'colocate': rollout worker i shares learner rank i's bundle (same "
                                 "node; the same GPU when both GPU shares add up to at most 1), needs num_workers equal "
                                 "to learner.num_workers, and the engines sleep while the learner trains "
                                 "(docs/gpus.md).")
    max_staleness: int = Field(0, ge=0, description="Policy versions a training batch may lag the learner by. 0: "
                               "synchronous (each step samples with the learner's current weights). k > 0: the "
                               "rollout workers sample the next k steps' prompts while the learner trains (one-step "
                               "off-policy for k=1); the loss corrects with algorithm.tis_cap. The staleness metric "
                               "reports each step's lag (docs/architecture.md, Overlap).")
    steps_per_generation: int = Field(1, ge=1, description="Training steps whose prompts one engine call samples "
                                      "together (TRL's steps_per_generation): steps are taken in aligned blocks of "
                                      "this many, and a block's batches are generated in one larger decode batch, "
                                      "then trained on one step at a time. Its later steps train on older samples, "
                                      "so it needs max_staleness >= steps_per_generation - 1 (and max_staleness >= "
                                      "steps_per_generation to also overlap with training). 1: one call per step.")


def check_steps_per_generation(cfg: ExperimentConfig) -> None:
    """``rollout.steps_per_generation`` g > 1: a block's last step trains on samples g - 1 versions old, which
    ``rollout.max_staleness`` must allow; DAPO's extra rounds are drawn per step, so it takes no blocks."""
    g, k = cfg.rollout.steps_per_generation, cfg.rollout.max_staleness
    if g == 1:
        return
    if k < g - 1:
        raise ConfigError(f"rollout.steps_per_generation={g}: the last step of a block trains on samples {g - 1} "
                          f"policy versions old, rollout.max_staleness={k} allows {k} (set max_staleness >= {g - 1}, "
                          f"or >= {g} to also sample while the learner trains)")
    if getattr(cfg.algorithm, "dynamic_sampling", False):
        raise ConfigError(f"rollout.steps_per_generation={g} with algorithm.dynamic_sampling: dynamic sampling "
                          "draws its extra rounds step by step (set steps_per_generation: 1)")


class RewardConfig(BaseModel):
    """Reward workers: how many, which reward, its deadline."""

    model_config = ConfigDict(extra="forbid")
    num_workers: int = Field(1, ge=0, description="Reward worker actors; rollout shards are spread across them. 0: "
                             "each rollout worker scores its own batches in its process (no reward actors, no hop; "
                             "for cheap rule-based rewards on few cores; the reward's cpus, timeout and restarts are "
                             "the rollout workers').")
    spec: Annotated[SerializeAsAny[Spec], REWARD] = Field(
        default_factory=REWARD.make_default, description="Reward: `name` selects it (default math), the rest are its options.")
    run: RewardRunConfig = Field(default_factory=RewardRunConfig, description="Per-batch deadline and threads.")
    cpus_per_worker: float = Field(0.1, gt=0, description="Ray CPUs reserved per reward worker.")
    timeout_s: float = Field(120.0, gt=0, description="Longest a reward call may take before the run fails.")
    max_restarts: int = Field(3, ge=0, description="Times Ray restarts a reward worker whose process died, per worker; "
                              "its unfinished scoring calls run again (counted in the reward_restarts metric). 0: a "
                              "dead worker fails the run.")


class RolePlacement(BaseModel):
    """Where one role's actors may run: custom Ray resources per actor and the strategy of the role's placement group."""

    model_config = ConfigDict(extra="forbid")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources each actor of the role "
                                        "needs, e.g. {node_b: 1}: only nodes started with that resource take the role.")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement strategy of the role's placement group (SPREAD: one actor per node where "
        "possible). A Tune trial packs all its roles in one placement group and ignores it.")


class RayConfig(BaseModel):
    """How the driver reaches Ray."""

    model_config = ConfigDict(extra="forbid")
    address: str = Field("", description="Cluster address; empty: RAY_ADDRESS if set (ray job submit), else a new local instance.")
    num_cpus: int = Field(0, ge=0, description="Logical CPUs of a new local instance (0: Ray's default).")
    local_mode: bool = Field(False, description="Run groups in-process without Ray (single learner rank only).")
    placement_timeout_s: float = Field(60.0, gt=0, description="Longest wait for a role's placement group to be scheduled.")
    connect_timeout_s: float = Field(30.0, gt=0, description="Longest wait for the cluster at ray.address / RAY_ADDRESS "
                                     "to answer; after it the run fails naming the address (never hangs).")
    placement: dict[str, RolePlacement] = Field(default_factory=dict, description="Per role (rollout, reward, learner, "
                                                 "env): custom resources and placement strategy of its actors.")


class ExperimentConfig(BaseModel):
    """A whole experiment. ``experiment`` names the YAML it came from."""

    model_config = ConfigDict(extra="forbid")
    experiment: str = Field(DEFAULT_EXPERIMENT, description="Name of the experiment YAML under configs/experiments/.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    task: Annotated[SerializeAsAny[Spec], TASK] = Field(
        default_factory=TASK.make_default, description="Prompt task: `name` selects it (default digit_add), the rest "
        "are its options.")
    data: DataConfig = Field(default_factory=DataConfig, description="Handling of malformed dataset rows (prompts "
                             "and offline records).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout workers.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Reward workers.")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="Learner group.")
    algorithm: SerializeAsAny[AlgorithmConfig] = Field(
        default_factory=lambda: algorithm_config({}), description="Algorithm hyper-parameters; `name` selects it "
        "(any registered algorithm, plugins included).")
    env: EnvConfig = Field(default_factory=EnvConfig, description="The gymnasium env and its env-runner actors (classic-RL algorithms such as ppo_env only).")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Driver loop.")
    callbacks: list[Annotated[SerializeAsAny[Spec], CALLBACK]] = Field(
        default_factory=lambda: [CALLBACK.parse({"name": name}) for name in DEFAULT_CALLBACKS],
        description="Callbacks, each `name` and its options.",
    )
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray connection.")

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm(cls, value: Any) -> AlgorithmConfig:
        return algorithm_config(value)

    @model_validator(mode="after")
    def _check(self) -> ExperimentConfig:
        self.algorithm.check(self)
        check_data(self)
        if self.learner.strategy == "single" and self.learner.num_workers != 1:
            raise ConfigError(f"learner.strategy 'single' runs one rank; learner.num_workers is {self.learner.num_workers} "
                              "(use 'fsdp2' or 'ddp' for more)")
        if "rollout" in self.algorithm.roles:
            check_engine_gpus(self.rollout.engine, self.rollout.gpus_per_worker)
            check_training = getattr(self.rollout.engine, "check_training", None)  # engines that may not take weights
            if check_training is not None:
                check_training()
            check_adapter_sync(self.learner.lora, self.rollout.engine)
        check_colocation(self)
        if self.rollout.max_staleness and self.rollout.placement == "colocate":
            raise ConfigError(f"rollout.max_staleness={self.rollout.max_staleness} samples while the learner trains; "
                              "rollout.placement: colocate makes engines and learner ranks take turns on one device "
                              "(use placement: split, or max_staleness: 0)")
        check_steps_per_generation(self)
        if self.learner.critic_optim is not None and not hasattr(self.algorithm, "critic_lr"):
            raise ConfigError(f"learner.critic_optim: algorithm {self.algorithm.name!r} trains no critic (unset it)")
        if self.ray.local_mode and self.learner.num_workers != 1:
            raise ConfigError("ray.local_mode runs in-process and supports learner.num_workers=1 only")
        if self.learner.max_restarts and "rollout" not in self.algorithm.roles:
            raise ConfigError(f"learner.max_restarts={self.learner.max_restarts}: only the online loop (algorithms with "
                              f"rollout workers) restarts its learner group; algorithm {self.algorithm.name!r} fails "
                              "on a dead rank (set it to 0 and resume with trainer.resume_from=auto)")
        if self.trainer.resume_from == "auto" and not self.trainer.run_name:
            raise ConfigError("trainer.resume_from=auto needs trainer.run_name: a stable run directory "
                              "(run_root/run_name) to look for checkpoints in")
        for role, where in self.ray.placement.items():
            if role not in self.algorithm.roles:
                raise ConfigError(f"ray.placement.{role}: algorithm {self.algorithm.name!r} has the roles "
                                  f"{list(self.algorithm.roles)}")
            if {"CPU", "GPU"} & where.resources.keys():
                raise ConfigError(f"ray.placement.{role}.resources: set CPUs and GPUs with {role}.cpus_per_worker / "
                                  f"{role}.gpus_per_worker; resources are for custom ones")
        return self
