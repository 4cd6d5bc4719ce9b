"""`ExperimentConfig`: every section of an experiment, validated before any actor starts.

Each component's own options live next to the component (``SamplingConfig`` in
engines, ``LearnerConfig`` in learner, ...); this module composes them and checks
what spans sections: registry names and options, and the batch arithmetic.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator, model_validator

from toolbox.config.algorithm import DEFAULT_ALGORITHM, AlgorithmConfig
from toolbox.core.errors import ConfigError
from toolbox.core.registry import Registry
from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.learner.config import LearnerConfig
from toolbox.models.loading import ModelConfig
from toolbox.rewards.base import REWARDS
from toolbox.rewards.runner import RewardRunConfig
from toolbox.rl.envs import EnvConfig

Spec = dict[str, Any]


def algorithm_config(section: Any) -> AlgorithmConfig:
    """The registered config class named by ``section['name']`` (default grpo), validating the section.

    This is the config union, built from the algorithm registry: a plugin's algorithm needs no edit here.
    """
    if isinstance(section, AlgorithmConfig):
        return section
    if not isinstance(section, dict):
        raise ValueError(f"must be a mapping with a 'name', got {type(section).__name__}")
    from toolbox.algorithms import ALGORITHMS

    name = section.get("name", DEFAULT_ALGORITHM)
    if name not in ALGORITHMS:
        raise ValueError(f"name: {name!r} is not a registered algorithm; allowed: {ALGORITHMS.names()}")
    config = ALGORITHMS.get(name).config
    assert config is not None and issubclass(config, AlgorithmConfig), f"algorithm {name!r} registered no config class"
    return config.model_validate(section)


class RolloutConfig(BaseModel):
    """Rollout workers: how many, which engine, how they sample."""

    model_config = ConfigDict(extra="forbid")
    num_workers: int = Field(1, ge=1, description="Rollout worker actors; prompts are split across them.")
    engine: Spec = Field(default_factory=lambda: {"name": "hf"}, description="Engine spec: {'name': hf|vllm|sglang|http, **options}.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling for training rollouts.")
    cpus_per_worker: float = Field(0.25, gt=0, description="Ray CPUs reserved per rollout worker.")
    gpus_per_worker: float = Field(0.0, ge=0, description="Ray GPUs reserved per rollout worker.")
    timeout_s: float = Field(300.0, gt=0, description="Longest a rollout call may take before the run fails.")


class RewardConfig(BaseModel):
    """Reward workers: how many, which reward, its deadline."""

    model_config = ConfigDict(extra="forbid")
    num_workers: int = Field(1, ge=1, description="Reward worker actors; rollout shards are spread across them.")
    spec: Spec = Field(default_factory=lambda: {"name": "math"}, description="Reward spec: {'name': ..., **options}.")
    run: RewardRunConfig = Field(default_factory=RewardRunConfig, description="Per-batch deadline and threads.")
    cpus_per_worker: float = Field(0.1, gt=0, description="Ray CPUs reserved per reward worker.")
    timeout_s: float = Field(120.0, gt=0, description="Longest a reward call may take before the run fails.")


class TrainerConfig(BaseModel):
    """The driver loop: length, evaluation, checkpoints, where results go."""

    model_config = ConfigDict(extra="forbid")
    total_steps: int = Field(100, ge=1, description="Training steps (one rollout + update + weight sync each).")
    save_every: int = Field(0, ge=0, description="Checkpoint every N steps (0: only at the end).")
    eval_every: int = Field(0, ge=0, description="Evaluate every N steps (0: never during training).")
    eval_prompts: int = Field(32, ge=1, description="Held-out prompts per evaluation (greedy decoding).")
    seed: int = Field(0, description="Seed of prompts, sampling and initialisation.")
    run_root: str = Field("runs", description="Directory under which each run gets its own directory.")
    run_name: str = Field("", description="Run directory name; empty: '<experiment>-<timestamp>'.")
    resume_from: str = Field("", description="A checkpoint directory (runs/x/checkpoints/step_N) or a run directory (its latest).")


class RayConfig(BaseModel):
    """How the driver reaches Ray."""

    model_config = ConfigDict(extra="forbid")
    address: str = Field("", description="Cluster address; empty: RAY_ADDRESS if set (ray job submit), else a new local instance.")
    num_cpus: int = Field(0, ge=0, description="Logical CPUs of a new local instance (0: Ray's default).")
    local_mode: bool = Field(False, description="Run groups in-process without Ray (single learner rank only).")
    placement_timeout_s: float = Field(60.0, gt=0, description="Longest wait for a role's placement group to be scheduled.")


class ExperimentConfig(BaseModel):
    """A whole experiment. ``experiment`` names the YAML it came from."""

    model_config = ConfigDict(extra="forbid")
    experiment: str = Field("grpo_tiny", description="Name of the experiment YAML under configs/experiments/.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    task: Spec = Field(default_factory=lambda: {"name": "digit_add"}, description="Prompt task spec: {'name': ..., **options}.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout workers.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Reward workers.")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="Learner group.")
    algorithm: SerializeAsAny[AlgorithmConfig] = Field(
        default_factory=lambda: algorithm_config({}), description="Algorithm hyper-parameters; `name` selects it "
        "(any registered algorithm, plugins included).")
    env: EnvConfig = Field(default_factory=EnvConfig, description="The gymnasium env (classic-RL algorithms such as ppo_env only).")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Driver loop.")
    callbacks: list[Spec] = Field(
        default_factory=lambda: [{"name": "console"}, {"name": "jsonl"}, {"name": "tensorboard"}, {"name": "curves"}],
        description="Callback specs, each {'name': ..., **options}.",
    )
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray connection.")

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm(cls, value: Any) -> AlgorithmConfig:
        return algorithm_config(value)

    @model_validator(mode="after")
    def _check(self) -> ExperimentConfig:
        from toolbox.callbacks import CALLBACKS
        from toolbox.data.tasks import TASKS

        specs: list[tuple[Registry, str, Spec]] = [
            (TASKS, "task", self.task), (ENGINES, "rollout.engine", self.rollout.engine), (REWARDS, "reward.spec", self.reward.spec),
        ]
        specs += [(CALLBACKS, f"callbacks.{i}", spec) for i, spec in enumerate(self.callbacks)]
        for registry, path, spec in specs:
            spec.update(registry.validate(spec, path))
        self.algorithm.check(self)
        if self.learner.strategy == "single" and self.learner.num_workers != 1:
            raise ConfigError(f"learner.strategy 'single' runs one rank; learner.num_workers is {self.learner.num_workers} "
                              "(use 'fsdp2' or 'ddp' for more)")
        if self.ray.local_mode and self.learner.num_workers != 1:
            raise ConfigError("ray.local_mode runs in-process and supports learner.num_workers=1 only")
        return self
