"""The classic-RL section: PPO on a gymnasium env (rollout length, GAE, epochs, clipping, early stop).

Its check also refuses settings of the LLM worker sections it never builds (``rollout``,
``reward``): env runners are sized by the ``env`` section, and the env gives the rewards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, Field

from toolbox.algorithms.pieces import ValueLossChoice
from toolbox.config.algorithm import AlgorithmConfig, BatchShape, TrainedModels
from toolbox.core.errors import ConfigError
from toolbox.models.mlp import PolicyConfig, SpaceSpec

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


class PPOEnvConfig(AlgorithmConfig, ValueLossChoice):
    """The algorithm section of a classic-RL experiment (PPO on a gymnasium env)."""

    name: Literal["ppo_env"] = Field("ppo_env", description="Algorithm: selects the config, learner, loop and wiring.")
    steps_per_env: int = Field(128, ge=1, description="Steps each env copy takes per training step (rollout length T).")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (1: Monte Carlo returns, 0: one-step TD).")
    epochs: int = Field(4, ge=1, description="Passes over each rollout batch.")
    minibatches: int = Field(4, ge=1, description="Optimizer steps per epoch (the batch is shuffled and split).")
    clip: float = Field(0.2, gt=0, description="Policy ratio clip range: ratio in [1 - clip, 1 + clip].")
    vf_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    ent_coef: float = Field(0.01, ge=0, description="Weight of the entropy bonus.")
    target_kl: float | None = Field(None, gt=0, description="Stop the epochs early once approx KL exceeds this (null: never).")
    normalize_advantages: bool = Field(True, description="Whiten advantages per minibatch.")
    scale_rewards: bool = Field(False, description="Divide rewards by the running std of the discounted return (saved with the weights).")
    reward_clip: float = Field(10.0, gt=0, description="Clip scaled rewards to [-reward_clip, reward_clip].")
    target_return: float | None = Field(None, description="Stop once `target_metric` reaches this (null: run to the budget).")
    target_metric: Literal["eval_return", "episode_return"] = Field(
        "eval_return", description="What target_return is compared with: the mean return of the last evaluation, or "
        "`episode_return`, the mean of the last `return_window` training episodes (RLlib's episode_return_mean).")
    eval_episodes: int = Field(20, ge=1, description="Episodes per evaluation (deterministic policy, fresh seeds), split over runners.")
    return_window: int = Field(100, ge=1, description="Training episodes the reported `episode_return` averages over.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="Policy/value networks and observation normalisation.")
    # Env runners are the `env` role: env.num_workers / cpus_per_worker / timeout_s size them.
    roles: ClassVar[tuple[str, ...]] = ("env", "learner")

    def check(self, exp: ExperimentConfig) -> None:
        from toolbox.envs.make import check_env

        refuse_unused_sections(exp)
        lr = exp.learner
        if lr.strategy not in {"single", "ddp"}:
            raise ConfigError(f"learner.strategy: ppo_env trains a small MLP; use 'single' or 'ddp', not {lr.strategy!r}")
        if exp.trainer.export:
            raise ConfigError("trainer.export: ppo_env trains a small MLP policy, not a causal LM, so there is no Hugging "
                              "Face model to write; its weights are in the checkpoints under RUN_DIR/checkpoints")
        if self.target_return is not None and self.target_metric == "eval_return" and not exp.trainer.eval_every:
            raise ConfigError("algorithm.target_return is set but trainer.eval_every is 0: the run would never evaluate "
                              "and so never stop at the target; set trainer.eval_every (e.g. 2)")
        steps = exp.env.num_workers * exp.env.num_envs * self.steps_per_env
        if steps % lr.num_workers or steps // lr.num_workers < self.minibatches:
            raise ConfigError(
                f"batch arithmetic: env.num_workers x env.num_envs x algorithm.steps_per_env = {steps} env steps per "
                f"training step must split evenly over learner.num_workers={lr.num_workers} ranks into "
                f"algorithm.minibatches={self.minibatches} minibatches"
            )
        check_policy(check_env(exp.env), self.policy, exp.env.id)  # unknown ids, unsupported spaces fail here

    def models(self) -> TrainedModels:
        return TrainedModels(policy="mlp")  # an actor-critic MLP: its value head is part of it

    def batch(self, exp: ExperimentConfig) -> BatchShape:
        """Env steps of every runner's env copies; PPO's minibatches split them (no micro-batches)."""
        env = exp.env
        steps = env.num_workers * env.num_envs * self.steps_per_env
        how = (("env steps per step", f"{env.num_workers} runners x {env.num_envs} envs x {self.steps_per_env} = {steps}"),)
        return BatchShape(steps, "env steps", mini_batches=self.minibatches, epochs=self.epochs, micro_batched=False,
                          how=how)


def check_policy(spec: SpaceSpec, policy: PolicyConfig, env_id: str) -> None:
    """A `ConfigError` when the policy's encoder cannot read the env's observations (a CNN on a vector, an image
    too small for its kernels)."""
    from toolbox.models.cnn import conv_output_hw, image_layout

    if policy.encoder != "cnn":
        return
    try:
        _, h, w = image_layout(spec.obs_shape, policy.cnn)
    except ValueError as err:
        raise ConfigError(f"algorithm.policy.encoder=cnn: env.id={env_id}: {err}; use encoder 'mlp'") from None
    try:
        conv_output_hw(h, w, policy.cnn)
    except ValueError as err:
        raise ConfigError(f"algorithm.policy.cnn: env.id={env_id} has {h}x{w} images: {err}") from None


# Why ppo_env has no use for each LLM worker section, and where its counterpart lives.
UNUSED_SECTIONS = {
    "rollout": "its env runners are sized by env.num_workers, env.cpus_per_worker and env.timeout_s",
    "reward": "the env gives the rewards, so no reward workers start",
}


def refuse_unused_sections(exp: ExperimentConfig) -> None:
    """A `ConfigError` naming every field of ``rollout`` / ``reward`` set to a value other than its default.

    Compared by value, not by whether the field was written, so the resolved
    ``config.yaml`` of a run (every section at its defaults) loads again.
    """
    for name, why in UNUSED_SECTIONS.items():
        section: BaseModel = getattr(exp, name)
        changed = changed_fields(name, section, type(section)())
        if changed:
            raise ConfigError(f"{', '.join(changed)}: algorithm.name=ppo_env does not use the {name} section ({why}); "
                              f"remove {'it' if len(changed) == 1 else 'them'}")


def changed_fields(path: str, value: Any, default: Any) -> list[str]:
    """``path.field=value`` for every leaf of ``value`` that differs from ``default`` (nested models recursed).

    A spec that selects another registry entry is named by its ``name``; a spec kept
    as a dict counts as changed only when its name does (validation has filled in its
    options' defaults).
    """
    if isinstance(value, BaseModel) and isinstance(default, BaseModel):
        if type(value) is type(default):
            return [item for field in type(value).model_fields
                    for item in changed_fields(f"{path}.{field}", getattr(value, field), getattr(default, field))]
        name = getattr(value, "name", None)  # a typed spec that selects another registry entry
        return [f"{path}.name={name!r}" if isinstance(name, str) else f"{path}={value!r}"]
    if isinstance(value, dict) and isinstance(default, dict) and "name" in default:
        return [] if value.get("name") == default["name"] else [f"{path}.name={value.get('name')!r}"]
    return [] if value == default else [f"{path}={value!r}"]
