"""The running batch's key/value cache: left-padded rows that join, leave and share one ``DynamicCache``.

Rows are left-aligned by padding, so every row's next token sits in the same (last) column. A newcomer's
prefill cache is merged in by left-padding the shorter of the two caches with zeros (masked out by the
attention mask) and concatenating along the batch dimension; a finished row is dropped with
``batch_select_indices``; columns that no remaining row attends to are trimmed from the left.

Only caches made of full-attention ``DynamicLayer`` s are handled (no sliding-window or linear-attention
layers): `check_cache` refuses anything else loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache


@dataclass
class BatchKV:
    """A batch's cache plus its ``[B, L]`` attention mask (0 at left padding)."""

    cache: DynamicCache
    mask_BL: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.mask_BL.shape[0])


def check_cache(cache: DynamicCache) -> None:
    """Refuse a cache whose layers this module cannot pad and concatenate."""
    for i, layer in enumerate(cache.layers):
        if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
            raise NotImplementedError(
                f"toolbox serve: cache layer {i} is {type(layer).__name__}; continuous batching here supports only "
                "full-attention DynamicLayer caches (no sliding-window or recurrent layers)")


def _layers(cache: DynamicCache) -> list[Any]:
    """The cache's layers, whose ``keys`` / ``values`` `check_cache` has vouched for."""
    return list(cache.layers)


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the sequence dimension (-2 of ``[B, H, L, D]``, -1 of a ``[B, L]`` mask) on the left to ``width``."""
    dim = -2 if t.dim() == 4 else -1
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    pad = (0, 0, missing, 0) if dim == -2 else (missing, 0)
    return F.pad(t, pad)


def merge(running: BatchKV | None, newcomers: BatchKV) -> BatchKV:
    """The running rows followed by the newcomers' rows, in one cache."""
    if running is None or running.size == 0:
        return newcomers
    width = max(running.mask_BL.shape[1], newcomers.mask_BL.shape[1])
    for old, new in zip(_layers(running.cache), _layers(newcomers.cache), strict=True):
        old.keys = torch.cat([_left_pad(old.keys, width), _left_pad(new.keys, width)], dim=0)
        old.values = torch.cat([_left_pad(old.values, width), _left_pad(new.values, width)], dim=0)
    mask = torch.cat([_left_pad(running.mask_BL, width), _left_pad(newcomers.mask_BL, width)], dim=0)
    return BatchKV(running.cache, mask)


def keep_rows(batch: BatchKV, rows: list[int]) -> BatchKV | None:
    """Only ``rows`` (in that order), with the left columns no kept row attends to trimmed; None if none kept."""
    if not rows:
        return None
    index = torch.tensor(rows, dtype=torch.long)
    batch.cache.batch_select_indices(index)
    mask = batch.mask_BL[index]
    start = int((mask.sum(dim=0) > 0).long().argmax())
    if start > 0:
        for layer in _layers(batch.cache):
            layer.keys = layer.keys[:, :, start:]
            layer.values = layer.values[:, :, start:]
        mask = mask[:, start:]
    return BatchKV(batch.cache, mask)
