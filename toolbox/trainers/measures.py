"""What the policy loops measure beside the learner's own metrics: the mean of the ranks' metric dicts, the staleness of
a step's batch and each role's idle share of the step, and the mean reward of greedy completions (the evaluation of
`OnlineTrainer` and of a plugin's loop)."""

from __future__ import annotations

from toolbox.data.prompts import PromptSource, split_even
from toolbox.engines.base import SamplingConfig
from toolbox.rewards.base import RewardResult
from toolbox.rl.roles import (
    Metrics,
    RewardRole,
    RolloutRole,
)


def mean_over_ranks(per_rank: list[Metrics]) -> Metrics:
    keys = per_rank[0].keys()
    return {k: sum(m[k] for m in per_rank) / len(per_rank) for k in keys}


def greedy_reward(prompts: PromptSource, rollout: RolloutRole, reward: RewardRole, sampling: SamplingConfig,
                  num_prompts: int) -> Metrics:
    """Mean reward of greedy completions of ``num_prompts`` held-out prompts (the loops' evaluation)."""
    greedy = sampling.model_copy(update={"temperature": 0.0})
    requests = prompts.eval_set(num_prompts)
    scored = reward.score(rollout.generate(split_even(requests, len(rollout)), greedy))
    return {"reward": RewardResult.concat(scored.result()).metrics()["reward"]}


def role_shares(metrics: Metrics, staleness: int) -> Metrics:
    """``staleness`` of the step's batch (learner steps between the weights that sampled its first round and the
    learner's), and the share of the step's wall time (``driver_wait_s``) each role was idle: rollout workers busy
    for the batch's generation plus the weight load (``generate_s + sync_s``), learner ranks for ``train_s``. With
    ``max_staleness > 0`` the batch was (mostly) generated during the step before, so the rollout share is exact in
    the steady state, where every step generates one batch."""
    shares = {"staleness": float(staleness)}
    window = metrics["driver_wait_s"]
    if "generate_s" in metrics:
        shares["rollout_idle"] = max(0.0, 1.0 - (metrics["generate_s"] + metrics["sync_s"]) / window)
    if "train_s" in metrics:
        shares["learner_idle"] = max(0.0, 1.0 - metrics["train_s"] / window)
    return shares
