"""The running batch's key/value cache: rows that join (`join`, a prefill) and leave (`keep`) between decode steps.

`SlotKV` runs the lean decode loop's own decoders (`toolbox.engines.decode.forward_for`: `LlamaDecoder` for
Llama / Qwen2 / Mistral, toolbox's GPT decoder), whose cache is one tensor ``[layers, 2, rows, heads, slots,
head_dim]``. It is allocated once for ``max_rows`` rows; the running rows are its first rows, and a step decodes a
view of them. Every row writes its next key at the same slot, but a row attends only to the slots its mask marks:
a newcomer's prompt is prefilled straight into the slots just before that shared slot (the slot moves on when a
prompt is longer than the slots filled so far), and a finished row is replaced by a row from the end of the batch,
so joining and leaving copy only the rows that move. When the slots run out, those that no running row attends to
are dropped from the left, and the cache grows only if that frees none.

`DynamicKV` is for every other ``transformers`` model: a ``DynamicCache`` merged by left padding. Only caches of
full-attention ``DynamicLayer`` s are handled (no sliding-window or linear-attention layers): `check_cache`
refuses anything else loudly.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from toolbox.engines.decode import forward_for
from toolbox.models.causal_lm import Decoder


class RunningKV(Protocol):
    """The cache of the running batch's rows, in batch order."""

    size: int

    def join(self, prompts: list[list[int]]) -> torch.Tensor:
        """Prefill ``prompts`` as new rows after the running ones; their last-position logits ``[k, V]``."""
        ...

    def step(self, token_B: torch.Tensor) -> torch.Tensor:
        """One decode step of every running row (``token_B``: each row's last token); the logits ``[B, V]``."""
        ...

    def keep(self, order: list[int]) -> None:
        """Keep the rows ``order`` names, row j of the new batch being old row ``order[j]``."""
        ...


class SlotDecoder(Decoder, Protocol):
    """A lean decoder whose cache is one tensor ``[layers, 2, rows, heads, slots, head_dim]`` it writes at slot
    ``filled`` (`LlamaDecoder`, toolbox's GPT decoder)."""

    cache: torch.Tensor
    filled: int


def running_kv(model: Any, max_rows: int, pad_id: int, slots: int = 64) -> RunningKV:
    """`SlotKV` (starting with ``slots`` slots) where the lean loop has a decoder for ``model`` with a tensor
    cache, else `DynamicKV`. Outside inference mode: `forward_for` may move the model's weights."""
    decoder = forward_for(model, "auto", max_rows, slots)
    if isinstance(getattr(decoder, "cache", None), torch.Tensor):
        return SlotKV(cast(SlotDecoder, decoder), pad_id)
    return DynamicKV(model, pad_id)


def left_padded(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as left-padded ids ``[k, P]`` and their mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


class SlotKV:
    """The lean decoders' cache tensor, shared by rows that come and go (see the module docstring)."""

    def __init__(self, decoder: SlotDecoder, pad_id: int) -> None:
        self.decoder, self.pad_id = decoder, pad_id
        self.full = decoder.cache
        self.size = 0
        rows, slots = self.full.shape[2], self.full.shape[4]
        self.keys_RL = torch.zeros((rows, slots), dtype=torch.bool, device=self.full.device)
        self.pos_R = torch.zeros(rows, dtype=torch.long, device=self.full.device)

    def join(self, prompts: list[list[int]]) -> torch.Tensor:
        ids, mask = left_padded(prompts, self.pad_id, self.full.device)
        k, width = ids.shape
        self._room(max(self.decoder.filled, width) + 1)
        end = max(self.decoder.filled, width)
        rows = slice(self.size, self.size + k)
        # The decoder prefills into a view of the newcomers' rows that starts ``width`` slots before ``end``.
        self.decoder.cache, self.decoder.filled = self.full[:, :, rows, :, end - width :], 0
        logits = self.decoder.prefill(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
        self.keys_RL[rows] = False
        self.keys_RL[rows, end - width : end] = mask.bool()
        self.pos_R[rows] = mask.sum(-1)
        self.decoder.filled = end
        self.size += k
        return logits

    def step(self, token_B: torch.Tensor) -> torch.Tensor:
        self._room(self.decoder.filled + 1)
        n = self.size
        self.keys_RL[:n, self.decoder.filled] = True
        self.decoder.cache = self.full[:, :, :n]
        logits = self.decoder.step(token_B, self.pos_R[:n], self.keys_RL[:n])
        self.pos_R[:n] += 1
        return logits

    def keep(self, order: list[int]) -> None:
        moved = [(j, src) for j, src in enumerate(order) if j != src]
        if moved:
            dst = torch.tensor([j for j, _ in moved], device=self.full.device)
            src = torch.tensor([s for _, s in moved], device=self.full.device)
            self.full[:, :, dst] = self.full[:, :, src]
            self.keys_RL[dst], self.pos_R[dst] = self.keys_RL[src], self.pos_R[src]
        self.size = len(order)
        if not order:
            self.decoder.filled = 0

    def _room(self, slots: int) -> None:
        """At least ``slots`` slots: drop the leading slots no running row attends to, or else grow."""
        if slots <= self.full.shape[4]:
            return
        used = self.keys_RL[: self.size, : self.decoder.filled].any(0).nonzero()
        start = int(used[0]) if len(used) else self.decoder.filled
        if start > 0:
            kept = self.decoder.filled - start
            n = self.size
            self.full[:, :, :n, :, :kept] = self.full[:, :, :n, :, start : self.decoder.filled].clone()
            self.keys_RL[:n, :kept] = self.keys_RL[:n, start : self.decoder.filled].clone()
            self.keys_RL[:, kept:] = False
            self.decoder.filled = kept
            slots -= start
        if slots > self.full.shape[4]:
            grown = max(slots, 2 * self.full.shape[4])
            full = self.full.new_zeros((*self.full.shape[:4], grown, self.full.shape[5]))
            full[:, :, :, :, : self.decoder.filled] = self.full[:, :, :, :, : self.decoder.filled]
            keys = self.keys_RL.new_zeros((self.keys_RL.shape[0], grown))
            keys[:, : self.decoder.filled] = self.keys_RL[:, : self.decoder.filled]
            self.full, self.keys_RL = full, keys


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
    return F.pad(t, (0, 0, missing, 0) if dim == -2 else (missing, 0))


class DynamicKV:
    """A transformers model's own forward over one ``DynamicCache``: newcomers' caches merged in by left padding
    (rows stay left-aligned, so every row's next token sits in the last column), finished rows dropped with
    ``batch_select_indices`` and the left columns no row attends to trimmed."""

    def __init__(self, model: Any, pad_id: int) -> None:
        self.model, self.pad_id = model, pad_id
        self.device = next(model.parameters()).device
        self.cache: DynamicCache | None = None
        self.mask_BL = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self.size = 0

    def join(self, prompts: list[list[int]]) -> torch.Tensor:
        ids, mask = left_padded(prompts, self.pad_id, self.device)
        cache = DynamicCache(config=getattr(self.model, "config", None))
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                            cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        check_cache(cache)  # the forward pass filled ``cache`` in place
        if self.cache is None or self.size == 0:
            self.cache, self.mask_BL = cache, mask
        else:
            width = max(self.mask_BL.shape[1], mask.shape[1])
            for old, new in zip(_layers(self.cache), _layers(cache), strict=True):
                old.keys = torch.cat([_left_pad(old.keys, width), _left_pad(new.keys, width)], dim=0)
                old.values = torch.cat([_left_pad(old.values, width), _left_pad(new.values, width)], dim=0)
            self.mask_BL = torch.cat([_left_pad(self.mask_BL, width), _left_pad(mask, width)], dim=0)
        self.size += len(prompts)
        return logits

    def step(self, token_B: torch.Tensor) -> torch.Tensor:
        ones = torch.ones((self.size, 1), dtype=torch.long, device=self.device)
        self.mask_BL = torch.cat([self.mask_BL, ones], dim=1)
        positions = self.mask_BL.sum(dim=1, keepdim=True) - 1
        return self.model(input_ids=token_B[:, None], attention_mask=self.mask_BL, position_ids=positions,
                          cache=self.cache, use_cache=True).logits[:, -1]

    def keep(self, order: list[int]) -> None:
        self.size = len(order)
        if not order or self.cache is None:
            self.cache = None
            return
        index = torch.tensor(order, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(index)
        mask = self.mask_BL[index]
        start = int((mask.sum(dim=0) > 0).long().argmax())
        if start > 0:
            for layer in _layers(self.cache):
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
            mask = mask[:, start:]
        self.mask_BL = mask
