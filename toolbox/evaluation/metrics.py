"""Evaluation metrics over prompts sampled ``n`` times: pass@1, pass@k, mean reward, response length, errors.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code"): with ``c`` of ``n`` samples correct, the chance that at least one of
``k`` samples drawn without replacement is correct, ``1 - C(n-c, k) / C(n, k)``, averaged over
prompts. A sample is correct when its reward is scored (not abstained, not an error) and at
least ``threshold``. Abstentions and errors are counted, never scored as 0 in the mean reward.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from toolbox.rewards.base import RewardStatus


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate for one prompt with ``c`` correct of ``n`` samples (exact integer binomials)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k holds a correct sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class PromptResult:
    """Every sample of one prompt: its responses, their rewards (None unless scored), statuses and token lengths."""

    prompt: str
    answer: Any
    responses: list[str]
    rewards: list[float | None]
    status: list[str]  # RewardStatus names, lower case: ok / abstain / error
    reasons: list[str]
    lengths: list[int]

    def correct(self, threshold: float) -> int:
        return sum(r is not None and r >= threshold for r in self.rewards)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def status_name(code: int) -> str:
    return RewardStatus(code).name.lower()


def summarize(results: list[PromptResult], k: int, threshold: float = 1.0) -> dict[str, float]:
    """pass@1, pass@k (k = samples per prompt), mean scored reward, mean response length and reward status counts."""
    if not results:
        raise ValueError("no prompts to summarize: the eval split is empty")
    n = len(results[0].responses)
    if any(len(r.responses) != n for r in results):
        raise ValueError("every prompt must have the same number of samples")
    scored = [v for r in results for v in r.rewards if v is not None]
    statuses = [s for r in results for s in r.status]
    lengths = [n_tok for r in results for n_tok in r.lengths]
    return {
        "prompts": float(len(results)),
        "samples_per_prompt": float(n),
        "pass@1": _mean([pass_at_k(n, r.correct(threshold), 1) for r in results]),
        f"pass@{k}": _mean([pass_at_k(n, r.correct(threshold), k) for r in results]),
        "reward_mean": _mean(scored) if scored else float("nan"),
        "response_len_mean": _mean(lengths),
        "reward_abstain": float(statuses.count("abstain")),
        "reward_error": float(statuses.count("error")),
    }


def _mean(values: list[float] | list[int]) -> float:
    return float(sum(values)) / len(values)
