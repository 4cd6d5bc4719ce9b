"""Algorithm loops (driver side): a fixed `BaseTrainer.fit` skeleton and one small `train_step` per algorithm."""

from toolbox.core.registry import Registry

TRAINERS: Registry = Registry("trainer")

from toolbox.trainers import dpo, grpo, ppo_env, sft  # noqa: E402,F401  (registers built-in trainers)
