"""The shape of a step's sampling (`GroupShape`) and DAPO's dynamic sampling (`DynamicRounds`): which groups carry
signal, and which to train on after several rounds. The Protocols are what the online loop reads of an algorithm's
config (`toolbox.algorithms.pieces.GroupSampling` and `DynamicSampling` have them)."""

from __future__ import annotations

from typing import Protocol

import torch

from toolbox.rl.advantages import within_noise


class GroupShape(Protocol):
    """How many prompts a step samples and how many completions each gets."""

    @property
    def prompts_per_step(self) -> int: ...

    @property
    def group_size(self) -> int: ...


class DynamicRounds(Protocol):
    """Whether a step samples more rounds until enough groups carry signal, and how many at most."""

    @property
    def dynamic_sampling(self) -> bool: ...

    @property
    def max_sampling_rounds(self) -> int: ...


def informative_groups(values_B: torch.Tensor, ok_B: torch.Tensor, group_B: torch.Tensor) -> dict[int, bool]:
    """Per group id: whether its scored rewards differ beyond float noise (a group of equal rewards has zero
    advantage: `toolbox.rl.advantages.within_noise`, the same test the advantages use)."""
    out: dict[int, bool] = {}
    for g in group_B.unique().tolist():
        rows = (group_B == g) & ok_B
        vals = values_B[rows]
        out[int(g)] = bool(vals.numel() > 1 and not within_noise(vals.max(), vals.min()))
    return out


def choose_groups(rounds: list[dict[int, bool]], need: int) -> list[int]:
    """DAPO dynamic sampling: the first ``need`` informative groups over the rounds, in order; if too few,
    filled up with uninformative ones (zero advantage: they keep the batch shape, move nothing)."""
    flags = [(g, ok) for r in rounds for g, ok in sorted(r.items())]
    chosen = [g for g, ok in flags if ok][:need]
    chosen += [g for g, ok in flags if not ok][: need - len(chosen)]
    return sorted(chosen)
