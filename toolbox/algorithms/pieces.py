"""Small config pieces that algorithm configs compose: group sampling, policy epochs, the loss of each family, KL,
dynamic sampling, overlong handling, off-policy correction, the mixture-of-experts router loss.

An algorithm's config class lists the pieces it uses (``class PPOConfig(AlgorithmConfig, GroupSampling,
PolicyEpochs, PolicyLossChoice, KL)``), never a sibling algorithm's config: with ``extra="forbid"``,
a field of a piece the algorithm does not list is an error at start that names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny

from toolbox.config.algorithm import PAIR_ROWS, BatchShape
from toolbox.core.errors import ConfigError
from toolbox.core.registry import Spec
from toolbox.data.offline import OfflineDataConfig
from toolbox.objectives.kl import KLKind
from toolbox.objectives.registry import (
    POLICY_LOSSES,
    PREFERENCE_LOSSES,
    SUPERVISED_LOSSES,
    VALUE_LOSSES,
    LossOf,
)

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


class Piece(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GroupSampling(Piece):
    """How many prompts a step samples and how many completions each gets."""

    prompts_per_step: int = Field(16, ge=1, description="Distinct prompts sampled per step.")
    group_size: int = Field(8, ge=1, description="Completions sampled per prompt (G).")
    temperature: float = Field(1.0, gt=0, description="Temperature the learner applies to logits (match sampling).")

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


class PolicyEpochs(Piece):
    """PPO-style reuse of a rollout batch: epochs over it, optimizer steps per epoch."""

    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch.")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per epoch (the batch is split into this many).")


POLICY_LOSS = LossOf(POLICY_LOSSES, default="ppo_clip")
PREFERENCE_LOSS = LossOf(PREFERENCE_LOSSES, default="sigmoid")
SUPERVISED_LOSS = LossOf(SUPERVISED_LOSSES, default="sft")
VALUE_LOSS = LossOf(VALUE_LOSSES, default="clipped_mse")


class PolicyLossChoice(Piece):
    """The policy loss (`toolbox.objectives.registry.POLICY_LOSSES`) and its options."""

    loss: Annotated[SerializeAsAny[Spec], POLICY_LOSS] = Field(
        default_factory=POLICY_LOSS.make_default, description="Policy loss: `name` selects it (default ppo_clip, "
        "the clipped surrogate; gspo, cispo, or a plugin's), the other keys are its options "
        "(algorithm.loss.clip_high=0.28).")


class PreferenceLossChoice(Piece):
    """The preference loss (`toolbox.objectives.registry.PREFERENCE_LOSSES`) and its options."""

    loss: Annotated[SerializeAsAny[Spec], PREFERENCE_LOSS] = Field(
        default_factory=PREFERENCE_LOSS.make_default, description="Preference loss: `name` selects it (default "
        "sigmoid, DPO's; ipo, hinge, or a plugin's), the other keys are its options.")


class SupervisedLossChoice(Piece):
    """The supervised loss (`toolbox.objectives.registry.SUPERVISED_LOSSES`) and its options."""

    loss: Annotated[SerializeAsAny[Spec], SUPERVISED_LOSS] = Field(
        default_factory=SUPERVISED_LOSS.make_default, description="Supervised loss: `name` selects it (default sft: "
        "mean over every target token of the global batch; seq: mean over examples of each example's token mean), "
        "the other keys are its options.")


class ValueLossChoice(Piece):
    """The critic's loss (`toolbox.objectives.registry.VALUE_LOSSES`) and its options."""

    value_loss: Annotated[SerializeAsAny[Spec], VALUE_LOSS] = Field(
        default_factory=VALUE_LOSS.make_default, description="Value loss of the critic: `name` selects it (default "
        "clipped_mse), the other keys are its options.")


class KL(Piece):
    """A KL term to the frozen initial policy."""

    kl_coef: float = Field(0.0, ge=0, description="Weight of the KL-to-reference term; 0 skips the reference model.")
    kl_kind: KLKind = Field("k3", description="KL estimator: k1, k2 or k3.")


class DynamicSampling(Piece):
    """DAPO's dynamic sampling: groups whose rewards are all equal are dropped and the batch topped up."""

    dynamic_sampling: bool = Field(False, description="DAPO: drop groups whose rewards are all equal, top the batch up.")
    max_sampling_rounds: int = Field(3, ge=1, description="Rollout rounds per step at most when topping the batch up.")


class Overlong(Piece):
    """DAPO's handling of responses cut at ``max_new_tokens``."""

    overlong_filter: bool = Field(False, description="DAPO: leave responses cut at max_new_tokens out of the loss.")
    overlong_buffer: int = Field(0, ge=0, description="DAPO soft overlong punishment: the last N tokens before the limit.")
    overlong_penalty: float = Field(1.0, ge=0, description="Reward subtracted (linearly over the buffer) at the length limit.")


class RouterLossWeight(Piece):
    """The mixture-of-experts router load-balancing loss every language-model learner adds
    (`toolbox.learner.router.RouterLoss`)."""

    moe_aux_loss_coef: float = Field(0.0, ge=0, description="Mixture-of-experts models (transformers' Qwen2MoE, "
                                     "Mixtral, ...): add coef x the router load-balancing loss (Switch Transformer's, "
                                     "the model's own load_balancing_loss_func) of each training forward to the loss, "
                                     "reported as moe_aux_loss. 0: off; an error on a dense model.")


DEFAULT_TIS_CAP = 2.0  # the cap of the TIS fix's own experiments (Yao et al., 2025)


class OffPolicy(Piece):
    """Truncated importance sampling of tokens sampled by another policy than the learner's (a batch generated ahead,
    ``rollout.max_staleness > 0``)."""

    tis_cap: float | None = Field(None, ge=0, description="Truncated importance sampling: each token's policy loss is "
                                  "weighted by min(pi_old / pi_behaviour, tis_cap), pi_behaviour being the engine's "
                                  "log-prob when it sampled the token. Unset: 2.0 when rollout.max_staleness > 0, off "
                                  "when it is 0 (offline_grpo: 2.0 with importance=truncated); 0: off.")


def check_off_policy(exp: ExperimentConfig, a: OffPolicy) -> None:
    """Resolve an unset ``tis_cap`` from ``rollout.max_staleness``, so the written config.yaml states the cap used."""
    if a.tis_cap is None:
        a.tis_cap = DEFAULT_TIS_CAP if exp.rollout.max_staleness else 0.0


def check_rollout_batch(exp: ExperimentConfig, a: GroupSampling, mini_batches: int = 1) -> None:
    """Rollouts of a step must split over the learner ranks, and each rank's share into whole micro-batches (a share
    no larger than ``learner.micro_batch_size`` is one micro-batch)."""
    lr, rows = exp.learner, a.rollouts_per_step
    per_rank, rem = divmod(rows, lr.num_workers)
    if rem:
        raise ConfigError(
            f"batch arithmetic: algorithm.prompts_per_step x algorithm.group_size = {a.prompts_per_step} x "
            f"{a.group_size} = {rows} rollouts do not split over learner.num_workers={lr.num_workers} ranks"
        )
    per_mini, rem = divmod(per_rank, mini_batches)
    if rem or (per_mini > lr.micro_batch_size and per_mini % lr.micro_batch_size):
        raise ConfigError(
            f"batch arithmetic: each learner rank gets {per_rank} rollouts per step, split into "
            f"algorithm.mini_batches={mini_batches} mini-batches of learner.micro_batch_size={lr.micro_batch_size}; "
            f"{per_rank} must be a multiple of {mini_batches * lr.micro_batch_size}"
        )


def rollout_batch(exp: ExperimentConfig, a: GroupSampling, epochs: int = 1, mini_batches: int = 1) -> BatchShape:
    """The batch of an online policy step: ``prompts_per_step x group_size`` rollouts, sampled by whole groups."""
    workers = exp.rollout.num_workers
    how = (("rollouts per step", f"{a.prompts_per_step} prompts x {a.group_size} samples = {a.rollouts_per_step}"),
           ("per rollout worker", f"~{-(-a.prompts_per_step // workers)} prompt groups (whole groups over {workers} "
                                  "workers)"))
    return BatchShape(a.rollouts_per_step, "rollouts", mini_batches=mini_batches, epochs=epochs, how=how)


def offline_batch(a: OfflineDataConfig) -> BatchShape:
    """The batch of an offline step: ``batch_size`` records, each a pair of rows when the records are preferences."""
    pairs = a.record_kind == "preference"
    return BatchShape(a.batch_size, "pairs" if pairs else "records", rows_per_example=PAIR_ROWS if pairs else 1,
                      max_length=a.max_length, how=((f"{'pairs' if pairs else 'records'} per step",
                                                     f"algorithm.batch_size = {a.batch_size}"),))
