"""Next-token choice for one row of the running batch, and the log-probs the server reports.

The reported log-prob of a sampled token is the learner's ``log_softmax(logits / T)`` (greedy: ``T = 1``), from
`toolbox.models.logprobs.token_logprobs`, the same function the ``hf`` engine and the learners use. ``top_p``
only narrows the set sampled from; it does not renormalise the reported log-prob (vLLM's
``processed_logprobs`` and the ``hf`` engine agree when ``top_p`` is 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolbox.models.logprobs import token_logprobs


@dataclass(frozen=True)
class Choice:
    """One sampled token: its id, its log-prob and, if asked for, the ``top`` most likely (id, log-prob) pairs."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


def _nucleus(probs_V: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` with everything outside the smallest set of mass >= ``top_p`` zeroed (the top token always kept)."""
    if top_p >= 1.0:
        return probs_V
    sorted_p, order = probs_V.sort(descending=True)
    outside = sorted_p.cumsum(0) - sorted_p >= top_p
    sorted_p = sorted_p.masked_fill(outside, 0.0)
    return torch.zeros_like(probs_V).scatter(0, order, sorted_p)


def choose(logits_V: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator,
           num_top: int = 0) -> Choice:
    """Sample (or, at ``temperature == 0``, take the argmax of) one token from a row's last-position logits."""
    logits = logits_V.float()
    if temperature == 0.0:
        token = int(logits.argmax())
    else:
        probs = _nucleus(torch.softmax(logits / temperature, dim=-1), top_p)
        token = int(torch.multinomial(probs, 1, generator=generator))
    scale = 1.0 if temperature == 0.0 else temperature
    top_ids = logits.topk(num_top).indices.tolist() if num_top > 0 else []
    ids = torch.tensor([[token, *top_ids]])
    logp = token_logprobs(logits.expand(1, ids.shape[1], -1), ids, scale)[0].tolist()
    return Choice(token, logp[0], list(zip(top_ids, logp[1:], strict=True)))
