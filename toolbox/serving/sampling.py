"""Next-token choice for every row of the running batch at once, and the log-probs the server reports.

Each row has its own temperature (0: greedy), top-k (0: off) and top-p, held as tensors, so one step samples the
whole batch with a handful of tensor ops (`sample_rows`). A token is drawn as ``argmax(p / q)`` with ``q ~ Exp(1)``
(the draw ``torch.multinomial`` makes), the noise of each row coming from that row's own seeded generator: a
request's tokens depend on its seed, never on which other requests share its steps.

The reported log-prob of a token is ``log_softmax(logits / T)`` (greedy: ``T = 1``), the formula of the learner's
`toolbox.models.logprobs.token_logprobs`. ``top_k`` / ``top_p`` only narrow the set sampled from; they do not
renormalise the reported log-prob (vLLM's ``processed_logprobs`` and the ``hf`` engine agree when both are off).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolbox.engines.decode import top_p_filter


@dataclass(frozen=True)
class Choice:
    """One sampled token: its id, its log-prob and, if asked for, the ``top`` most likely (id, log-prob) pairs."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class RowSampling:
    """The sampling settings of the batch's rows, one entry per row."""

    temperature_B: torch.Tensor  # float; 0 is greedy
    top_k_B: torch.Tensor  # long; 0 keeps every token
    top_p_B: torch.Tensor  # float; 1 keeps every token
    num_top: int  # most top log-probs any row asks for
    generators: list[torch.Generator]

    @classmethod
    def of(cls, settings: list[tuple[float, int, float]], num_top: int, generators: list[torch.Generator],
           device: torch.device) -> RowSampling:
        """From per-row ``(temperature, top_k, top_p)``."""
        temperature, top_k, top_p = zip(*settings, strict=True) if settings else ((), (), ())
        return cls(torch.tensor(temperature, dtype=torch.float32, device=device),
                   torch.tensor(top_k, dtype=torch.long, device=device),
                   torch.tensor(top_p, dtype=torch.float32, device=device), num_top, generators)


@dataclass
class Sampled:
    """One step's tokens ``[B]``, their log-probs ``[B]``, and the ``num_top`` most likely ids / log-probs ``[B, K]``."""

    token_B: torch.Tensor
    logprob_B: torch.Tensor
    top_ids_BK: torch.Tensor
    top_logprobs_BK: torch.Tensor


def top_k_filter(scores_BV: torch.Tensor, top_k_B: torch.Tensor) -> torch.Tensor:
    """Scores below each row's ``top_k``-th largest set to -inf (rows with ``top_k`` 0 untouched)."""
    k_max = min(int(top_k_B.max()), scores_BV.shape[-1])
    kth = scores_BV.topk(k_max, dim=-1).values.gather(-1, (top_k_B.clamp(1, k_max) - 1)[:, None])
    return scores_BV.masked_fill((scores_BV < kth) & (top_k_B[:, None] > 0), float("-inf"))


def exponential_noise(generators: list[torch.Generator], vocab: int, device: torch.device,
                      skip: list[bool]) -> torch.Tensor:
    """``[B, V]`` draws of Exp(1), row i from ``generators[i]`` (a skipped row's generator does not advance)."""
    noise = torch.ones((len(generators), vocab), dtype=torch.float32)
    for row, (generator, greedy) in enumerate(zip(generators, skip, strict=True)):
        if not greedy:
            noise[row].exponential_(1, generator=generator)  # generators live on the CPU
    return noise.to(device)


def sample_rows(logits_BV: torch.Tensor, rows: RowSampling) -> Sampled:
    """Each row's next token under its own settings, its log-prob, and the top log-probs."""
    scores = logits_BV.float()
    greedy = (rows.temperature_B == 0).tolist()
    scale_B = torch.where(rows.temperature_B > 0, rows.temperature_B, 1.0)
    scaled = scores / scale_B[:, None]
    if all(greedy):
        token_B = scores.argmax(-1)
    else:
        narrowed = scaled
        if bool((rows.top_k_B > 0).any()):
            narrowed = top_k_filter(narrowed, rows.top_k_B)
        if bool((rows.top_p_B < 1).any()):
            narrowed = top_p_filter(narrowed, rows.top_p_B[:, None])
        noise = exponential_noise(rows.generators, scores.shape[-1], scores.device, greedy)
        token_B = (torch.softmax(narrowed, -1) / noise).argmax(-1)
        if any(greedy):
            token_B = torch.where(rows.temperature_B == 0, scores.argmax(-1), token_B)
    top_ids_BK = scores.topk(rows.num_top, dim=-1).indices if rows.num_top else token_B[:, None][:, :0]
    # token_logprobs' formula, at several labels per row: one log-softmax, then a gather of the token and the top ids.
    logp = torch.log_softmax(scaled, -1).gather(-1, torch.cat([token_B[:, None], top_ids_BK], dim=1))
    return Sampled(token_B, logp[:, 0], top_ids_BK, logp[:, 1:])
