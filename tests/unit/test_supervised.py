"""`toolbox.objectives.supervised`: masked next-token NLL, global normalisation, document boundaries."""

from __future__ import annotations

import math

import pytest
import torch

from toolbox.models.logprobs import token_logprobs
from toolbox.objectives.supervised import (
    document_mean_nll,
    document_weights,
    masked_nll,
    shift_targets,
)


def test_uniform_logits_give_log_vocab() -> None:
    logits = torch.zeros(2, 3, 5)
    labels = torch.tensor([[0, 1, 2], [3, 4, 0]])
    assert torch.allclose(token_logprobs(logits, labels), torch.full((2, 3), -math.log(5)))
    assert masked_nll(logits, labels, torch.ones(2, 3)).item() == pytest.approx(math.log(5))


def test_masked_nll_hand_computed_and_global_count() -> None:
    # Two tokens: p = 1/2 (logits [0, 0]) and p = e^2 / (e^2 + 1) (logits [2, 0], label 0); one masked out.
    logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [0.0, 9.0]]])
    labels = torch.tensor([[1, 0, 0]])
    mask = torch.tensor([[1, 1, 0]])
    nll = [math.log(2), math.log1p(math.exp(-2))]
    assert masked_nll(logits, labels, mask).item() == pytest.approx(sum(nll) / 2, rel=1e-6)
    # A micro-batch divided by the global token count (say 8) sums, over micro-batches, to the global mean.
    assert masked_nll(logits, labels, mask, token_count=8).item() == pytest.approx(sum(nll) / 8, rel=1e-6)


def test_empty_mask_gives_zero_not_nan() -> None:
    logits = torch.randn(2, 4, 7, requires_grad=True)
    loss = masked_nll(logits, torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4))
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(logits.grad).all()


def test_shift_targets_masks_predictions_across_documents() -> None:
    ids = torch.tensor([[5, 6, 7, 8, 9, 0]])
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 0]])  # tokens 6, 7 (doc 1) and 8, 9 (doc 2) are targets
    docs = torch.tensor([[1, 1, 1, 2, 2, 0]])
    labels, mask = shift_targets(ids, loss_mask, docs)
    assert labels.tolist() == [[6, 7, 8, 9, 0]]
    # 7 -> 8 crosses from doc 1 to doc 2, 9 -> pad crosses into padding: both masked.
    assert mask.tolist() == [[True, True, False, True, False]]
    _, unbounded = shift_targets(ids, loss_mask)
    assert unbounded.tolist() == [[True, True, True, True, False]]


def test_document_weights_sum_to_one_per_document() -> None:
    docs = torch.tensor([[1, 1, 1, 2, 2], [1, 1, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 0, 1, 1], [0, 1, 0, 0, 0]])
    w = document_weights(docs, mask)
    assert w.tolist() == [[0.5, 0.5, 0.0, 0.5, 0.5], [0.0, 1.0, 0.0, 0.0, 0.0]]
    assert w.sum().item() == pytest.approx(3.0)  # three documents with a target token


def test_document_mean_nll_weights_documents_equally() -> None:
    # Doc 1: two tokens of NLL log 2; doc 2: one token of NLL log(1 + e^-2). Mean of means, not of tokens.
    logits = torch.tensor([[[0.0, 0.0], [0.0, 0.0], [2.0, 0.0]]])
    labels = torch.tensor([[1, 0, 0]])
    mask = torch.ones(1, 3)
    docs = torch.tensor([[1, 1, 2]])
    expected = (math.log(2) + math.log1p(math.exp(-2))) / 2
    assert document_mean_nll(logits, labels, mask, docs).item() == pytest.approx(expected, rel=1e-6)
    assert document_mean_nll(logits, labels, mask, docs, doc_count=4).item() == pytest.approx(expected / 2, rel=1e-6)
