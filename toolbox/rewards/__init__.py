"""Rewards: per-sample, three-state (value / abstain / error), never a silent 0."""

from toolbox.rewards.base import REWARDS, Reward, RewardResult, RewardSample, RewardStatus

__all__ = ["REWARDS", "Reward", "RewardResult", "RewardSample", "RewardStatus"]

from toolbox.rewards import math_answer, structure, verifiable  # noqa: E402,F401  (registers built-in rewards)
