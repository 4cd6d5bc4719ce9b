"""The reward interface and its three-state result."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from toolbox.core.registry import Registry


class RewardStatus(enum.IntEnum):
    """What became of one sample's reward."""

    OK = 0
    ABSTAIN = 1  # the reward has no opinion (e.g. no answer to check); excluded from the mean
    ERROR = 2  # the reward raised or overran its timeout; reason recorded, never a silent 0


@dataclass(frozen=True)
class RewardSample:
    """What a reward sees of one completion."""

    prompt: str
    response: str
    extras: dict[str, Any]


class Reward(Protocol):
    """Scores one sample: a float, or ``None`` to abstain. Raising marks the sample as an error."""

    def __call__(self, sample: RewardSample) -> float | None: ...


@dataclass
class RewardResult:
    """Per-sample rewards of a batch. ``values_B`` is 0 wherever ``status_B`` is not OK.

    ``seconds`` is how long scoring took (a concatenation keeps the longest).
    """

    values_B: torch.Tensor
    status_B: torch.Tensor
    reasons: list[str]
    seconds: float = 0.0

    def __len__(self) -> int:
        return int(self.values_B.shape[0])

    @property
    def ok_B(self) -> torch.Tensor:
        return self.status_B == RewardStatus.OK

    def metrics(self) -> dict[str, float]:
        """Mean over scored samples, and the counts of abstentions and errors."""
        ok = self.ok_B
        mean = float(self.values_B[ok].mean()) if ok.any() else float("nan")
        return {
            "reward": mean,
            "reward_abstain": float((self.status_B == RewardStatus.ABSTAIN).sum()),
            "reward_error": float((self.status_B == RewardStatus.ERROR).sum()),
        }

    def select(self, rows: torch.Tensor) -> RewardResult:
        """The results of ``rows`` (an index tensor), in that order."""
        return RewardResult(self.values_B[rows], self.status_B[rows], [self.reasons[i] for i in rows.tolist()],
                            self.seconds)

    @staticmethod
    def concat(results: list[RewardResult]) -> RewardResult:
        return RewardResult(
            values_B=torch.cat([r.values_B for r in results]),
            status_B=torch.cat([r.status_B for r in results]),
            reasons=[x for r in results for x in r.reasons],
            seconds=max((r.seconds for r in results), default=0.0),
        )


REWARDS: Registry[Reward] = Registry("reward")
