"""Rewards: per-sample, three-state (value / abstain / error), never a silent 0."""

from toolbox.rewards.base import REWARDS, Reward, RewardResult, RewardSample, RewardStatus

__all__ = ["REWARDS", "Reward", "RewardResult", "RewardSample", "RewardStatus"]

from toolbox.rewards import env_score as _env_score  # noqa: E402,F401  (the multi-turn env's score)

# Registers the built-in rewards (judge: llm_judge, learned: reward_model).
from toolbox.rewards import judge, learned, math_answer, structure, verifiable  # noqa: E402,F401
