"""Supervised (next-token) losses over masked tokens, the ``sft`` and ``seq`` supervised losses. The single source
of this math.

Logits at position ``t`` score ``labels[t]``: callers align them first (`shift_targets`).
Normalisers can be passed in, so a micro-batch is divided by the token (or document)
count of the whole global batch; that makes gradient accumulation and data
parallelism give the same gradient as one big batch. Log-probs come from
`toolbox.models.logprobs.token_logprobs`, the one source of that math.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from toolbox.models.logprobs import token_logprobs
from toolbox.objectives.aggregate import aggregate
from toolbox.objectives.registry import SUPERVISED_LOSSES


def shift_targets(input_ids_BT: torch.Tensor, loss_mask_BT: torch.Tensor,
                  doc_ids_BT: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and mask aligned with ``logits[:, :-1]``: position ``t`` predicts token ``t + 1``.

    With ``doc_ids_BT`` (packed rows), a prediction across a document boundary is masked
    out: the last token of one document never learns the first token of the next.
    """
    labels_BT = input_ids_BT[:, 1:]
    mask_BT = loss_mask_BT[:, 1:].bool()
    if doc_ids_BT is not None:
        mask_BT = mask_BT & (doc_ids_BT[:, 1:] == doc_ids_BT[:, :-1])
    return labels_BT, mask_BT


def token_nll(logits_BTV: torch.Tensor, labels_BT: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-token cross-entropy ``[B, T]``; with ``label_smoothing`` e, ``(1 - e) * nll + e * mean_v(-log p_v)``:
    the target distribution puts e/V on every token and 1 - e more on the label (`F.cross_entropy`'s definition)."""
    if not label_smoothing:
        return -token_logprobs(logits_BTV, labels_BT)
    logp_BTV = torch.log_softmax(logits_BTV.float(), dim=-1)
    labels = labels_BT.to(logp_BTV.device).unsqueeze(-1)
    nll_BT = -logp_BTV.gather(-1, labels).squeeze(-1)
    uniform_BT = -logp_BTV.mean(dim=-1)
    return ((1.0 - label_smoothing) * nll_BT + label_smoothing * uniform_BT).to(labels_BT.device)


def masked_nll(logits_BTV: torch.Tensor, labels_BT: torch.Tensor, mask_BT: torch.Tensor,
               token_count: float | None = None, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean negative log-likelihood over the tokens ``mask_BT`` selects (``sft``: every token counts once).

    ``token_count`` overrides the denominator (the global number of loss tokens). An
    empty mask gives 0, never NaN. ``label_smoothing``: see `token_nll`.
    """
    return aggregate(token_nll(logits_BTV, labels_BT, label_smoothing), mask_BT, "token-mean", token_count=token_count)


def document_weights(doc_ids_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Per-token weight ``1 / (loss tokens of its document)``: each document sums to 1.

    ``doc_ids_BT`` numbers documents uniquely within a row (ids may repeat across rows).
    Tokens outside ``mask_BT`` get weight 0.
    """
    mask = mask_BT.float()
    b, t = doc_ids_BT.shape
    key_BT = doc_ids_BT.long() + torch.arange(b, device=doc_ids_BT.device).unsqueeze(1) * (int(doc_ids_BT.max()) + 1)
    counts = torch.zeros(int(key_BT.max()) + 1, device=mask.device).index_add_(0, key_BT.reshape(-1), mask.reshape(-1))
    return mask / counts[key_BT].clamp(min=1.0)


def document_mean_nll(logits_BTV: torch.Tensor, labels_BT: torch.Tensor, mask_BT: torch.Tensor,
                      doc_ids_BT: torch.Tensor, doc_count: float | None = None,
                      label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean over documents of each document's mean token NLL (``seq``: every document counts once).

    ``doc_count`` overrides the denominator (the global number of documents with a loss token).
    ``label_smoothing``: see `token_nll`.
    """
    weights_BT = document_weights(doc_ids_BT, mask_BT)
    if doc_count is None:
        doc_count = float(weights_BT.sum())
    return (token_nll(logits_BTV, labels_BT, label_smoothing) * weights_BT).sum() / max(float(doc_count), 1.0)


def document_count(doc_ids_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """How many documents of ``doc_ids_BT`` have a loss token in ``mask_BT`` (0 for an empty batch)."""
    return float(round(float(document_weights(doc_ids_BT, mask_BT).sum()))) if mask_BT.numel() else 0.0


class _Smoothed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="Cross-entropy label smoothing e: the target puts "
                                   "e/V on every token of the vocabulary and 1 - e more on the label.")


class TokenMean(_Smoothed):
    """Mean NLL over every target token of the global batch: a long example weighs more (`masked_nll`)."""

    def count(self, mask_BT: torch.Tensor, doc_ids_BT: torch.Tensor) -> float:
        return float(mask_BT.sum())

    def __call__(self, logits_BTV: torch.Tensor, labels_BT: torch.Tensor, mask_BT: torch.Tensor,
                 doc_ids_BT: torch.Tensor, norm: float) -> torch.Tensor:
        return masked_nll(logits_BTV, labels_BT, mask_BT, token_count=norm, label_smoothing=self.label_smoothing)


class DocumentMean(_Smoothed):
    """Mean over documents of each document's mean token NLL: every example weighs the same (`document_mean_nll`)."""

    def count(self, mask_BT: torch.Tensor, doc_ids_BT: torch.Tensor) -> float:
        return document_count(doc_ids_BT, mask_BT)

    def __call__(self, logits_BTV: torch.Tensor, labels_BT: torch.Tensor, mask_BT: torch.Tensor,
                 doc_ids_BT: torch.Tensor, norm: float) -> torch.Tensor:
        return document_mean_nll(logits_BTV, labels_BT, mask_BT, doc_ids_BT, doc_count=norm,
                                 label_smoothing=self.label_smoothing)


SUPERVISED_LOSSES.register("sft", config=TokenMean)(TokenMean)
SUPERVISED_LOSSES.register("seq", config=DocumentMean)(DocumentMean)
