"""Online DPO's pairing (the best and the worst sample of each group by reward) and its sequence log-probs
(the model's own tokens only). The loss is `dpo_loss`."""

from __future__ import annotations

import torch


def best_worst_pairs(rewards_B: torch.Tensor, ok_B: torch.Tensor, group_size: int) -> tuple[torch.Tensor, ...]:
    """Per group: the row of its best and of its worst scored sample, and whether they differ.

    Returns ``(chosen_rows, rejected_rows, weight)``, each ``[groups]``; ``weight`` is 0 for a
    group with fewer than two scored samples or all-equal rewards (no preference to learn).
    """
    values = rewards_B.view(-1, group_size).float()
    ok = ok_B.view(-1, group_size)
    best = torch.where(ok, values, torch.tensor(float("-inf"))).argmax(dim=1)
    worst = torch.where(ok, values, torch.tensor(float("inf"))).argmin(dim=1)
    offset = torch.arange(values.shape[0]) * group_size
    gap = values.gather(1, best[:, None]).squeeze(1) - values.gather(1, worst[:, None]).squeeze(1)
    weight = ((ok.sum(dim=1) >= 2) & (gap > 0)).float()
    return offset + best, offset + worst, weight


def sequence_logps(logp_BR: torch.Tensor, loss_mask_BR: torch.Tensor, length_average: bool = False) -> torch.Tensor:
    """``log pi(response)`` per row, ``[B]``: the sum of the token log-probs where ``loss_mask_BR`` is 1.

    ``loss_mask_BR`` is the batch's ``loss_mask_BR``: in a multi-turn episode the environment's tokens (tool
    results) are context the policy did not choose, so they count in neither side of a preference.
    ``length_average`` (IPO) divides by the number of those tokens.
    """
    mask = loss_mask_BR.to(logp_BR.dtype)
    total = (logp_BR * mask).sum(dim=1)
    return total / mask.sum(dim=1).clamp(min=1) if length_average else total
