"""``env_score``: the score a multi-turn environment gave the episode, read from the row's extras.

The ``multi_turn`` engine (`toolbox.agents.multi_turn`) writes ``env_score`` (the env's per-turn rewards,
reduced) and, when the env failed, ``env_error`` into each row's extras. This reward passes the score on, so
the reward role stays in charge of what the learner sees: it composes with other rewards in
``weighted_sum``, and an env failure becomes a per-sample reward error, never a 0. When the env names the
parts of its score (``extras['env_parts']``), the value carries them as reward components.
"""

from __future__ import annotations

from toolbox.rewards.base import REWARDS, Composite, Reward, RewardSample


@REWARDS.register("env_score")
def env_score() -> Reward:
    """The multi-turn environment's episode score (``extras['env_score']``); an env failure is an error."""

    def score(sample: RewardSample) -> float:
        error = sample.extras.get("env_error")
        if error:
            raise RuntimeError(f"environment failed: {error}")
        if "env_score" not in sample.extras:
            raise KeyError("the row has no 'env_score' in its extras; env_score needs rollout.engine.name=multi_turn")
        parts = sample.extras.get("env_parts")
        value = float(sample.extras["env_score"])
        return Composite(value, {k: float(v) for k, v in parts.items()}) if parts else value

    return score
