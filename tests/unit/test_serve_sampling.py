"""The server's batched sampling against a per-row reference built from transformers' own logits warpers."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from toolbox.models.logprobs import token_logprobs
from toolbox.serving.sampling import RowSampling, sample_rows

# (temperature, top_k, top_p) per row: greedy, plain, top-k, top-p, both, a cold row with a tight nucleus.
SETTINGS = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 3, 0.6), (0.2, 0, 0.3)]
VOCAB = 40


def reference(logits_V: torch.Tensor, temperature: float, top_k: int, top_p: float,
              generator: torch.Generator) -> tuple[int, float]:
    """One row, one token, the slow way: warpers one by one, then argmax(p / Exp(1) noise from the row's
    generator) (the draw torch.multinomial makes); the log-prob is the learner's token_logprobs."""
    if temperature == 0.0:
        token = int(logits_V.argmax())
    else:
        scores = (logits_V / temperature)[None]
        if top_k:
            scores = TopKLogitsWarper(top_k)(torch.zeros((1, 1), dtype=torch.long), scores)
        if top_p < 1.0:
            scores = TopPLogitsWarper(top_p)(torch.zeros((1, 1), dtype=torch.long), scores)
        noise = torch.empty(VOCAB).exponential_(1, generator=generator)
        token = int((torch.softmax(scores[0], -1) / noise).argmax())
    logp = token_logprobs(logits_V[None, None], torch.tensor([[token]]), temperature or 1.0)
    return token, float(logp)


def rows_for(settings: list[tuple[float, int, float]], seeds: list[int], num_top: int = 0) -> RowSampling:
    return RowSampling.of(settings, num_top, [torch.Generator().manual_seed(s) for s in seeds], torch.device("cpu"))


def test_batched_sampling_equals_the_per_row_reference_step_after_step() -> None:
    logits = torch.Generator().manual_seed(0)
    seeds = [11, 12, 13, 14, 15, 16]
    batched = rows_for(SETTINGS, seeds)
    own = [torch.Generator().manual_seed(s) for s in seeds]
    for _ in range(5):  # generators advance the same way on both sides, step after step
        logits_BV = torch.randn((len(SETTINGS), VOCAB), generator=logits) * 3
        sampled = sample_rows(logits_BV, batched)
        expected = [reference(logits_BV[i], *SETTINGS[i], own[i]) for i in range(len(SETTINGS))]
        assert sampled.token_B.tolist() == [t for t, _ in expected]
        torch.testing.assert_close(sampled.logprob_B, torch.tensor([lp for _, lp in expected]))


def test_a_rows_tokens_do_not_depend_on_its_neighbours() -> None:
    logits_BV = torch.randn((len(SETTINGS), VOCAB), generator=torch.Generator().manual_seed(1))
    together = sample_rows(logits_BV, rows_for(SETTINGS, [5] * len(SETTINGS))).token_B
    alone = [int(sample_rows(logits_BV[i : i + 1], rows_for([s], [5])).token_B) for i, s in enumerate(SETTINGS)]
    assert together.tolist() == alone


def test_top_k_and_top_p_keep_the_sample_inside_their_set() -> None:
    logits_V = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2))
    allowed_k = set(logits_V.topk(3).indices.tolist())
    for seed in range(40):
        k_row = rows_for([(5.0, 3, 1.0)], [seed])  # hot: without the filter most draws would fall outside
        assert int(sample_rows(logits_V[None], k_row).token_B) in allowed_k
        p_row = rows_for([(5.0, 0, 1e-6)], [seed])  # a nucleus of one token: the most likely
        assert int(sample_rows(logits_V[None], p_row).token_B) == int(logits_V.argmax())


def test_top_log_probs_are_the_most_likely_tokens_at_the_rows_temperature() -> None:
    logits_BV = torch.randn((2, VOCAB), generator=torch.Generator().manual_seed(3))
    sampled = sample_rows(logits_BV, rows_for([(0.5, 0, 1.0), (0.0, 0, 1.0)], [1, 2], num_top=4))
    assert sampled.top_ids_BK.tolist() == logits_BV.topk(4).indices.tolist()
    expected = token_logprobs(logits_BV[:1, None].expand(1, 4, VOCAB), sampled.top_ids_BK[:1], 0.5)
    torch.testing.assert_close(sampled.top_logprobs_BK[:1], expected)
    torch.testing.assert_close(sampled.top_logprobs_BK[1:], torch.log_softmax(logits_BV[1:], -1).topk(4).values)
