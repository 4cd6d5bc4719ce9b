"""The reward interface and its three-state result."""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, Protocol

import torch

from toolbox.core.registry import Registry
from toolbox.core.wire import TensorFields


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


MAX_REASONS = 3  # distinct error reasons a step's metrics and log lines name


def reward_value(value: Any) -> float:
    """``value`` as a finite float, or ``ValueError`` saying what it was (the sample becomes an error).

    A real number (bools and 0-d numpy/torch values included) passes; a NaN, an infinity or anything else
    (a string, a list, a tensor of several values) is refused: one such value would otherwise poison a
    whole group's statistics.
    """
    if not isinstance(value, Real) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # a 0-d tensor or array
    if not isinstance(value, Real):
        raise ValueError(f"non-numeric reward {value!r:.80} ({type(value).__name__}); return a float, or None to "
                         "abstain")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"non-finite reward {number}")
    return number


class Composite(float):
    """A reward value that carries its parts: ``weighted_sum`` returns one, with each component's unweighted value
    (``None`` where it abstained), and the runner keeps the parts per sample (`RewardResult.components`)."""

    components: dict[str, float | None]

    def __new__(cls, value: float, components: dict[str, float | None]) -> Composite:
        out = super().__new__(cls, value)
        out.components = components
        return out


def component_names(names: list[str]) -> list[str]:
    """Names of a composite's parts: each component's registry name, ``name#2`` ... where one repeats."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


class Reward(Protocol):
    """Scores one sample: a float, or ``None`` to abstain. Raising marks the sample as an error."""

    def __call__(self, sample: RewardSample) -> float | None: ...


@dataclass
class RewardResult(TensorFields):
    """Per-sample rewards of a batch. ``values_B`` is 0 wherever ``status_B`` is not OK.

    ``seconds`` is how long scoring took (a concatenation keeps the longest); ``retries`` how many calls its
    worker retried meanwhile (a judge's; a concatenation sums them). ``max_error_rate`` is the
    run's ``reward.run.max_error_rate``, carried with the scores so whoever reads a whole step (the learner's
    plan) can refuse it (`check_error_rate`); a concatenation keeps the strictest.
    """

    values_B: torch.Tensor
    status_B: torch.Tensor
    reasons: list[str]
    seconds: float = 0.0
    max_error_rate: float = 1.0
    # Per sample, the parts of a composite reward (`Composite`); empty when the reward reports none.
    components: list[dict[str, float | None]] = field(default_factory=list)
    retries: int = 0

    def __len__(self) -> int:
        return int(self.values_B.shape[0])

    @property
    def ok_B(self) -> torch.Tensor:
        return self.status_B == RewardStatus.OK

    @property
    def error_rate(self) -> float:
        """The fraction of samples whose reward is an error (0 for an empty result)."""
        return float((self.status_B == RewardStatus.ERROR).float().mean()) if len(self) else 0.0

    def error_reasons(self) -> list[tuple[str, int]]:
        """Distinct error reasons with their counts, most common first (ties: first seen first)."""
        errors = (self.status_B == RewardStatus.ERROR).nonzero().squeeze(1).tolist()
        return Counter(self.reasons[i] for i in errors).most_common()

    def metrics(self) -> dict[str, float]:
        """Mean over scored samples, the counts of abstentions and errors, the error rate, and a count per
        error reason for the `MAX_REASONS` most common ones (``reward_error/<reason>``)."""
        ok = self.ok_B
        mean = float(self.values_B[ok].mean()) if ok.any() else float("nan")
        out = {
            "reward": mean,
            "reward_abstain": float((self.status_B == RewardStatus.ABSTAIN).sum()),
            "reward_error": float((self.status_B == RewardStatus.ERROR).sum()),
            "reward_error_rate": self.error_rate,
        }
        for reason, count in self.error_reasons()[:MAX_REASONS]:
            out[f"reward_error/{reason_key(reason)}"] = float(count)
        out.update(self.component_means())
        return out

    def component_means(self) -> dict[str, float]:
        """``reward/<component>``: each component's mean over the scored samples that report it (a composite's
        parts, abstentions left out)."""
        sums: dict[str, list[float]] = {}
        for row in self.ok_B.nonzero().squeeze(1).tolist() if self.components else []:
            for name, value in self.components[row].items():
                if value is not None:
                    sums.setdefault(name, []).append(value)
        return {f"reward/{name}": sum(values) / len(values) for name, values in sums.items()}

    def check_error_rate(self, where: str = "this step") -> None:
        """Raise `RewardErrorRateExceeded` when more than ``max_error_rate`` of the samples errored."""
        max_error_rate = self.max_error_rate
        if self.error_rate > max_error_rate:
            n_err = int((self.status_B == RewardStatus.ERROR).sum())
            common = "; ".join(f"{count}x {reason}" for reason, count in self.error_reasons()[:MAX_REASONS])
            raise RewardErrorRateExceeded(
                f"rewards of {where}: {n_err} of {len(self)} samples errored ({self.error_rate:.0%}), above "
                f"reward.run.max_error_rate={max_error_rate:g}; most common reasons: {common}. Fix the reward, "
                "or raise reward.run.max_error_rate to train on the samples that scored")

    def select(self, rows: torch.Tensor) -> RewardResult:
        """The results of ``rows`` (an index tensor), in that order."""
        return RewardResult(self.values_B[rows], self.status_B[rows], [self.reasons[i] for i in rows.tolist()],
                            self.seconds, self.max_error_rate,
                            [self.components[i] for i in rows.tolist()] if self.components else [])

    @staticmethod
    def concat(results: list[RewardResult]) -> RewardResult:
        return RewardResult(
            values_B=torch.cat([r.values_B for r in results]),
            status_B=torch.cat([r.status_B for r in results]),
            reasons=[x for r in results for x in r.reasons],
            seconds=max((r.seconds for r in results), default=0.0),
            max_error_rate=min((r.max_error_rate for r in results), default=1.0),
            components=[c for r in results for c in (r.components or [{}] * len(r))]
            if any(r.components for r in results) else [],
            retries=sum(r.retries for r in results),
        )


class RewardErrorRateExceeded(RuntimeError):
    """Too many samples of a step errored to learn from the rest: the run must stop, not train on noise."""


def reason_key(reason: str, limit: int = 60) -> str:
    """A reason shortened to one metric-name-friendly line: ``reward_error/<key>``."""
    line = " ".join(reason.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


REWARDS: Registry[Reward] = Registry("reward")
