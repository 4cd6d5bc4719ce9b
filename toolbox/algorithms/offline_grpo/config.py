"""The ``offline_grpo`` section: GRPO's update (advantage estimator, policy loss, KL, corrections) on stored rollouts.

The rollouts come from a file (`toolbox.data.rollouts`): a run's ``samples.jsonl`` or any dataset of groups with
their rewards and behaviour log-probs. ``prompts_per_step`` counts the stored groups a step trains on. Their tokens
were sampled by another policy than the one trained, so the loss is importance-corrected (``importance``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, PrivateAttr, model_validator

from toolbox.algorithms.grpo.config import GRPOUpdate
from toolbox.algorithms.pieces import DEFAULT_TIS_CAP, check_rollout_batch
from toolbox.config.algorithm import AlgorithmConfig, BatchShape, TrainedModels
from toolbox.core.errors import ConfigError
from toolbox.data.rows import DataConfig, is_local, local_path

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig

Importance = Literal["truncated", "ratio"]


class OfflineGRPOConfig(AlgorithmConfig, GRPOUpdate):
    """The algorithm section of GRPO (or RLOO, Dr. GRPO, ...: ``advantage``, ``loss``) trained on stored rollouts.

    ``prompts_per_step`` counts the stored groups of a step, ``group_size`` the samples every stored group has (a
    group of another size is a bad row), ``temperature`` must be the one the rollouts were sampled at (their
    behaviour log-probs are at it), and an unset ``tis_cap`` is 2.0 with ``importance=truncated``, 0 with ``ratio``.
    """

    name: Literal["offline_grpo"] = Field("offline_grpo", description="Algorithm: selects the config, learner, loop "
                                          "and wiring.")
    dataset: str = Field("", description="The stored rollouts: a run's RUN_DIR/samples.jsonl, or a .jsonl/.parquet/... "
                         "dataset of group rows {prompt or prompt_ids, responses (token ids), logprobs, rewards} "
                         "(docs/algorithms/grpo.md, GRPO on stored rollouts).")
    importance: Importance = Field("truncated", description="How the loss corrects for the tokens having been sampled "
                                   "by the behaviour policy: truncated: each token's loss weighted by min(pi_old / "
                                   "pi_behaviour, tis_cap) (the loss's ratio against the learner's own pi_old); ratio: "
                                   "the loss's ratio taken against pi_behaviour itself, clipped or truncated as "
                                   "algorithm.loss does (ppo_clip's clip range, cispo's cap).")
    roles: ClassVar[tuple[str, ...]] = ("learner",)
    # The experiment's `data` section (bad-row policy), set when the config is checked; travels to the learner ranks.
    _data: DataConfig = PrivateAttr(default_factory=DataConfig)

    @model_validator(mode="after")
    def _resolve_path(self) -> OfflineGRPOConfig:
        if self.dataset and is_local(self.dataset):  # the learner ranks may run elsewhere
            self.dataset = str(local_path(self.dataset))
        return self

    @property
    def data(self) -> DataConfig:
        return self._data

    def check(self, exp: ExperimentConfig) -> None:
        from toolbox.data.rollouts import load_rollout_groups

        if not self.dataset:
            raise ConfigError("algorithm.dataset: offline_grpo trains on stored rollouts; give a run's "
                              "RUN_DIR/samples.jsonl or a dataset of group rows")
        self.check_advantage()
        check_rollout_batch(exp, self, self.mini_batches)
        if self.importance == "ratio" and self.tis_cap:
            raise ConfigError(f"algorithm.tis_cap={self.tis_cap}: with algorithm.importance=ratio the loss's ratio is "
                              "already against the behaviour policy (pi_old is pi_behaviour, so the weight is 1); "
                              "unset tis_cap, or use importance=truncated")
        if self.tis_cap is None:  # resolved here, so the written config.yaml states the cap used
            self.tis_cap = DEFAULT_TIS_CAP if self.importance == "truncated" else 0.0
        self._data = exp.data
        try:  # every row now, so a bad one fails before any actor starts
            load_rollout_groups(self.dataset, self.group_size, exp.data.on_bad_row)
        except ConfigError as err:
            raise ConfigError(f"algorithm.dataset: {err}") from None

    def models(self) -> TrainedModels:
        return TrainedModels(reference=self.kl_coef > 0)

    def batch(self, exp: ExperimentConfig) -> BatchShape:
        how = (("rollouts per step", f"{self.prompts_per_step} stored groups x {self.group_size} samples = "
                                     f"{self.rollouts_per_step}"),)
        return BatchShape(self.rollouts_per_step, "rollouts", mini_batches=self.mini_batches, epochs=self.ppo_epochs,
                          how=how)
