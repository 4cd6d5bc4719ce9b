"""`ExperimentConfig`: every section of an experiment, validated before any actor starts.

Each component's own options live next to the component (``SamplingConfig`` in
engines, ``LearnerConfig`` in learner, ...); this module composes them and checks
what spans sections: registry names and options, and the batch arithmetic.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from toolbox.core.errors import ConfigError
from toolbox.core.registry import Registry
from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.learner.config import LearnerConfig
from toolbox.models.loading import ModelConfig
from toolbox.objectives.dpo import DPOConfig
from toolbox.objectives.grpo import GRPOConfig
from toolbox.objectives.online_dpo import OnlineDPOConfig
from toolbox.objectives.ppo import PPOEnvConfig
from toolbox.objectives.ppo_lm import PPOConfig
from toolbox.objectives.sft import SFTConfig
from toolbox.rewards.base import REWARDS
from toolbox.rewards.runner import RewardRunConfig
from toolbox.rl.envs import EnvConfig

Spec = dict[str, Any]


def _algorithm_name(value: Any) -> str:
    """The ``name`` of an algorithm section (a dict or a config); a section without one is GRPO's."""
    return value.get("name", "grpo") if isinstance(value, dict) else getattr(value, "name", "grpo")


# Every algorithm's config, told apart by its ``name`` field. A new algorithm adds its
# config class here (tagged with its name) and registers a recipe under the same name (toolbox.recipes).
AlgorithmConfig = Annotated[
    Annotated[GRPOConfig, Tag("grpo")] | Annotated[PPOConfig, Tag("ppo")] | Annotated[OnlineDPOConfig, Tag("online_dpo")] | Annotated[PPOEnvConfig, Tag("ppo_env")]
    | Annotated[SFTConfig, Tag("sft")] | Annotated[DPOConfig, Tag("dpo")],
    Discriminator(_algorithm_name),
]


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
    algorithm: AlgorithmConfig = Field(default_factory=GRPOConfig, description="Algorithm hyper-parameters; `name` selects it.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="The gymnasium env (classic-RL algorithms such as ppo_env only).")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Driver loop.")
    callbacks: list[Spec] = Field(
        default_factory=lambda: [{"name": "console"}, {"name": "jsonl"}, {"name": "tensorboard"}, {"name": "curves"}],
        description="Callback specs, each {'name': ..., **options}.",
    )
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray connection.")

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
        if isinstance(self.algorithm, GRPOConfig):
            self._check_grpo(self.algorithm)
        if isinstance(self.algorithm, PPOEnvConfig):
            self._check_ppo_env(self.algorithm)
        if isinstance(self.algorithm, (SFTConfig, DPOConfig)):
            self.algorithm.check_micro_batch(self.learner.num_workers, self.learner.micro_batch_size)
        if self.learner.strategy == "single" and self.learner.num_workers != 1:
            raise ConfigError(f"learner.strategy 'single' runs one rank; learner.num_workers is {self.learner.num_workers} "
                              "(use 'fsdp2' or 'ddp' for more)")
        if self.ray.local_mode and self.learner.num_workers != 1:
            raise ConfigError("ray.local_mode runs in-process and supports learner.num_workers=1 only")
        return self

    def _check_grpo(self, a: GRPOConfig) -> None:
        from toolbox.rl.advantages import ADVANTAGES

        lr = self.learner
        if a.advantage not in ADVANTAGES:
            raise ConfigError(f"algorithm.advantage: {a.advantage!r} is not one of {ADVANTAGES.names()}")
        rows = a.rollouts_per_step
        per_rank, rem = divmod(rows, lr.num_workers)
        if rem:
            raise ConfigError(
                f"batch arithmetic: algorithm.prompts_per_step x algorithm.group_size = {a.prompts_per_step} x "
                f"{a.group_size} = {rows} rollouts do not split over learner.num_workers={lr.num_workers} ranks"
            )
        if isinstance(a, OnlineDPOConfig) and a.prompts_per_step % lr.num_workers:
            raise ConfigError(f"batch arithmetic: online_dpo pairs within whole groups, so algorithm.prompts_per_step="
                              f"{a.prompts_per_step} must split over learner.num_workers={lr.num_workers} ranks")
        per_mini, rem = divmod(per_rank, a.mini_batches)
        if rem or per_mini % lr.micro_batch_size:
            raise ConfigError(
                f"batch arithmetic: each learner rank gets {per_rank} rollouts per step, split into "
                f"algorithm.mini_batches={a.mini_batches} mini-batches of learner.micro_batch_size={lr.micro_batch_size}; "
                f"{per_rank} must be a multiple of {a.mini_batches * lr.micro_batch_size}"
            )

    def _check_ppo_env(self, a: PPOEnvConfig) -> None:
        from toolbox.rl.envs import check_env

        lr = self.learner
        if lr.strategy not in {"single", "ddp"}:
            raise ConfigError(f"learner.strategy: ppo_env trains a small MLP; use 'single' or 'ddp', not {lr.strategy!r}")
        if a.target_return is not None and a.target_metric == "eval_return" and not self.trainer.eval_every:
            raise ConfigError("algorithm.target_return is set but trainer.eval_every is 0: the run would never evaluate "
                              "and so never stop at the target; set trainer.eval_every (e.g. 2)")
        steps = self.rollout.num_workers * self.env.num_envs * a.steps_per_env
        if steps % lr.num_workers or steps // lr.num_workers < a.minibatches:
            raise ConfigError(
                f"batch arithmetic: rollout.num_workers x env.num_envs x algorithm.steps_per_env = {steps} env steps per "
                f"training step must split evenly over learner.num_workers={lr.num_workers} ranks into "
                f"algorithm.minibatches={a.minibatches} minibatches"
            )
        check_env(self.env)  # an unknown id or an unsupported space fails here, before any actor starts
