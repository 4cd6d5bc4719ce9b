"""Examples -> model-ready rows: one example per row (right-padded) or several packed per row.

Packed rows carry per-document ``position_ids`` that restart at 0 and no 2-D
attention mask. transformers' mask builder (``masking_utils``, used by the sdpa,
eager, flash and flex attention paths) reads a restart of the positions as a
document boundary and builds a block-diagonal causal mask from it, so a token never
attends across documents; padding tokens get position 0 each, which makes every one
a document of its own. `check_packing` verifies a model honours this before training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolbox.data.encode import Example


@dataclass
class TokenBatch:
    """Rows of tokens. ``doc_ids_BT`` numbers documents within a row from 1; 0 is padding."""

    input_ids_BT: torch.Tensor
    loss_mask_BT: torch.Tensor
    position_ids_BT: torch.Tensor
    doc_ids_BT: torch.Tensor
    packed: bool

    def __len__(self) -> int:
        return int(self.input_ids_BT.shape[0])

    def select(self, rows: slice) -> TokenBatch:
        return TokenBatch(self.input_ids_BT[rows], self.loss_mask_BT[rows], self.position_ids_BT[rows],
                          self.doc_ids_BT[rows], self.packed)

    @property
    def attention_mask_BT(self) -> torch.Tensor | None:
        """The 2-D padding mask of unpacked rows; None for packed rows (the positions carry the boundaries)."""
        return None if self.packed else (self.doc_ids_BT > 0).long()

    def model_inputs(self) -> dict[str, torch.Tensor | bool | None]:
        """Keyword arguments of the model's forward. No KV cache: transformers ignores packed positions when one is given."""
        return {"input_ids": self.input_ids_BT, "position_ids": self.position_ids_BT,
                "attention_mask": self.attention_mask_BT, "use_cache": False}

    def documents(self) -> int:
        """How many documents (examples) the rows hold."""
        return int(sum(len(torch.unique(row[row > 0])) for row in self.doc_ids_BT))


def _rows_to_batch(rows: list[list[Example]], width: int, pad_id: int, packed: bool) -> TokenBatch:
    b = len(rows)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask, pos, doc = (torch.zeros((b, width), dtype=torch.long) for _ in range(3))
    for r, row in enumerate(rows):
        at = 0
        for d, ex in enumerate(row, start=1):
            n = len(ex)
            ids[r, at : at + n] = torch.tensor(ex.input_ids)
            mask[r, at : at + n] = torch.tensor(ex.loss_mask)
            pos[r, at : at + n] = torch.arange(n)
            doc[r, at : at + n] = d
            at += n
    return TokenBatch(ids, mask, pos, doc, packed)


def pad_examples(examples: list[Example], pad_id: int, width: int | None = None) -> TokenBatch:
    """One example per row, right-padded to the longest (or to ``width``)."""
    width = width or max((len(e) for e in examples), default=1)
    return _rows_to_batch([[e] for e in examples], max(width, 1), pad_id, packed=False)


def text_chunks(document: Example, max_length: int) -> list[Example]:
    """A raw-text document as consecutive pieces of at most ``max_length`` tokens (pretraining keeps all of a long
    document rather than cutting it); each piece is packed as a document of its own, its positions from 0."""
    return [Example(document.input_ids[i : i + max_length], document.loss_mask[i : i + max_length])
            for i in range(0, len(document), max_length)]


def first_fit(lengths: list[int], row_length: int) -> list[list[int]]:
    """Indices of items of ``lengths`` (each at most ``row_length``) placed into rows of ``row_length``,
    first-fit in the given order (deterministic); each row lists its items in placement order."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i, n in enumerate(lengths):
        slot = next((r for r, room in enumerate(free) if room >= n), None)
        if slot is None:
            rows.append([])
            free.append(row_length)
            slot = len(rows) - 1
        rows[slot].append(i)
        free[slot] -= n
    return rows


def pack_examples(examples: list[Example], row_length: int, pad_id: int) -> TokenBatch:
    """Several examples per row of ``row_length`` tokens, first-fit in the given order (deterministic).

    An example longer than ``row_length`` is cut to it. Rows are as many as needed.
    """
    cut = [ex.cut(row_length) for ex in examples]
    rows = [[cut[i] for i in row] for row in first_fit([len(ex) for ex in cut], row_length)]
    width = max((sum(len(ex) for ex in row) for row in rows), default=1)
    return _rows_to_batch(rows, width, pad_id, packed=True)


@torch.no_grad()
def logit_tolerance(logits: torch.Tensor) -> float:
    """How far two computations of the same logits may differ: 1e-3 in float32, 5e-2 in half precision. Taken from
    the logits themselves, i.e. the dtype the forward computed in (bf16 under FSDP2's mixed precision or autocast,
    while the sharded parameters stay float32)."""
    return 1e-3 if logits.dtype == torch.float32 else 5e-2


def check_packing(model: torch.nn.Module, vocab_size: int, tol: float | None = None) -> None:
    """Raise if ``model`` lets a packed document see the one before it (its attention ignores restarted positions).

    ``tol`` bounds the relative logit difference; default `logit_tolerance` of the dtype the forward computes in.
    """
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, vocab_size, (5,), generator=gen).tolist()
    b = torch.randint(0, vocab_size, (4,), generator=gen).tolist()
    docs = [Example(a, [1] * 5), Example(b, [1] * 4)]
    packed = pack_examples(docs, 9, 0)
    alone = pad_examples([docs[1]], 0)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits_packed = model(**packed.model_inputs()).logits[0, 5:]
            logits_alone = model(**alone.model_inputs()).logits[0]
    finally:
        model.train(was_training)
    tol = logit_tolerance(logits_alone) if tol is None else tol
    logits_packed, logits_alone = logits_packed.float(), logits_alone.float()
    scale = float(logits_alone.abs().max()) or 1.0
    err = float((logits_packed - logits_alone).abs().max()) / scale
    if err > tol:
        raise RuntimeError(f"{type(model).__name__} attends across packed documents (relative logit error {err:.2e}): "
                           "its attention does not honour restarted position_ids; set algorithm.packing=false")
