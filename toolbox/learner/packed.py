"""The RL learners' forwards over rollout rows, padded or packed, and how much of them was padding.

A `RolloutBatch` is left-padded prompts beside right-padded responses, so a micro-batch's
forward runs over ``B x (P + R)`` slots however short most rows are. Packed, the rows' real
tokens (prompt, then response) are laid end to end with positions restarting at 0 for each
row, placed as SFT packs (`toolbox.data.packing`: first-fit, no 2-D mask, so transformers builds a
block-diagonal causal mask from the restarts); each response token's log-prob (or value) is read
at the position that predicts it and put back at its ``[B, R]`` place. The numbers equal the
padded forward's up to float rounding (same tokens, same positions, same causal context).

Not covered: a response whose mask has holes (packing keeps a row's first ``mask.sum()`` response
tokens, so it refuses one), and attention that ignores restarted positions (`check_packing` at start).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from toolbox.data.packing import TokenBatch, check_packing, first_fit
from toolbox.learner.collective import global_sum
from toolbox.models.logprobs import response_logprobs, token_logprobs
from toolbox.models.value import response_values
from toolbox.rl.batch import RolloutBatch

if TYPE_CHECKING:
    from toolbox.learner.policy import PolicyRank


@dataclass
class PackedRows:
    """A batch's sequences packed into rows, and where each response token's predictor sits.

    ``at_N`` (packed row, column) of the position whose output predicts response token ``n``;
    ``to_N`` (batch row, response column) where it belongs in ``[B, R]``; ``labels_N`` the token.
    """

    inputs: TokenBatch
    at_N: tuple[torch.Tensor, torch.Tensor]
    to_N: tuple[torch.Tensor, torch.Tensor]
    labels_N: torch.Tensor
    shape_BR: tuple[int, int]

    def take(self, out_BT: torch.Tensor) -> torch.Tensor:
        """The model's output at each response token's predictor, ``[N, ...]``."""
        return out_BT[self.at_N[0].to(out_BT.device), self.at_N[1].to(out_BT.device)]

    def to_BR(self, values_N: torch.Tensor) -> torch.Tensor:
        """``values_N`` put back at their ``[B, R]`` places (0 elsewhere)."""
        out = torch.zeros(self.shape_BR, dtype=values_N.dtype, device=values_N.device)
        out[self.to_N[0].to(out.device), self.to_N[1].to(out.device)] = values_N
        return out


def sequence_lengths(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's real prompt and response token counts, ``([B], [B])``; refuses a response mask with holes."""
    prompt_B, response_B = batch.prompt_mask_BP.sum(1), batch.response_mask_BR.sum(1)
    prefix_BR = torch.arange(batch.response_mask_BR.shape[1]) < response_B.unsqueeze(1)
    holes = (batch.response_mask_BR.bool() != prefix_BR).any(1).nonzero().flatten().tolist()
    if holes:
        raise ValueError(f"learner.packing: response rows {holes[:5]} have a response_mask that is not a prefix of "
                         "1s (packing keeps each row's first mask.sum() tokens); set learner.packing=false")
    empty = ((prompt_B == 0) & (response_B > 0)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"learner.packing: rows {empty[:5]} have a response but no prompt token to predict it from")
    return prompt_B, response_B


# Tokens per packed row when the sequences are shorter. Fewer, longer rows cut the per-row overhead and the padding
# left at rows' ends, while sdpa's block-diagonal mask still computes a whole row's L x L attention. Measured on
# 2 CPU cores (one GRPO micro-batch, forward + backward, padded = 1): grpo_tiny 32 rows of <= 9 tokens, rows of
# 9 / 64 / 224 tokens 1.35 / 0.88 / 0.59; issue 11's "medium", 8 rows of <= 80 tokens, rows of 65 / 151 / 297
# tokens 0.69 / 0.47 / 0.52.
ROW_TOKENS = 256
# A micro-batch is packed only when its packed rows fill less than this share of the padded layout's slots. Packed rows
# are longer, and a row's attention costs L x L however much of it the block-diagonal mask discards, so packing a batch
# with little padding loses. Measured with one torch thread (issue 11's "small", 8 rows of 8-16 prompt tokens, one
# GRPO update, CPU time, packed / padded): responses of 64 tokens (padded layout 4% padding) 1.11, of 32-64 (14%) 1.02,
# of 16-64 (40%) 0.77, of 1-64 (54%) 0.52.
PACK_BELOW = 0.8


def pack_rows(batch: RolloutBatch, pad_id: int = 0, row_length: int | None = None) -> PackedRows:
    """The batch's sequences packed into rows of ``row_length`` tokens (default: `ROW_TOKENS`, or the longest
    sequence where that is longer).

    A row with no response token (masked out of the loss) is left out: nothing of it is read. Placement is SFT's
    `first_fit` (longest first); the rows are laid out with tensor ops rather than through `pack_examples`'
    per-token Python lists, which cost as much as a tiny model's forward (measured: 15 ms for 32 rows under load).
    """
    prompt_B, response_B = sequence_lengths(batch)
    keep_B = response_B > 0
    lengths_B = (prompt_B + response_B) * keep_B
    row_length = max(max(lengths_B.tolist(), default=1), row_length or ROW_TOKENS, 1)
    lengths = lengths_B.tolist()
    placed = _placement(lengths, row_length)
    where = [(0, 0, 0)] * len(batch)  # (packed row, start, document number in the row) of each batch row
    for row, items in enumerate(placed):
        at = 0
        for d, b in enumerate(items, start=1):
            where[b] = (row, at, d)
            at += lengths[b]
    row_B, start_B, doc_B = torch.tensor(where, dtype=torch.long).reshape(-1, 3).unbind(1)
    ids_BS = torch.cat([batch.prompt_ids_BP, batch.response_ids_BR], 1)
    mask_BS = torch.cat([batch.prompt_mask_BP, batch.response_mask_BR], 1).bool() & keep_B.unsqueeze(1)
    pos_BS = mask_BS.long().cumsum(1) - 1  # a token's place in its sequence: prompt (left-padded), then response
    b_N, s_N = mask_BS.nonzero(as_tuple=True)
    dest = (row_B[b_N], start_B[b_N] + pos_BS[b_N, s_N])
    width = max(int((start_B + lengths_B).max()) if len(batch) else 1, 1)
    shape = (max(len(placed), 1), width)
    ids, pos, doc = torch.full(shape, pad_id, dtype=torch.long), torch.zeros(shape, dtype=torch.long), torch.zeros(
        shape, dtype=torch.long)
    ids[dest], pos[dest], doc[dest] = ids_BS[b_N, s_N], pos_BS[b_N, s_N], doc_B[b_N]
    inputs = TokenBatch(ids, doc.clamp(max=1), pos, doc, packed=True)
    # Response token j of row b is predicted at its sequence's position prompt_B[b] - 1 + j.
    rb_N, rj_N = batch.response_mask_BR.bool().nonzero(as_tuple=True)
    predictors = (row_B[rb_N], start_B[rb_N] + prompt_B[rb_N] - 1 + rj_N)
    return PackedRows(inputs, predictors, (rb_N, rj_N), batch.response_ids_BR[rb_N, rj_N],
                      (len(batch), int(batch.response_ids_BR.shape[1])))


def _placement(lengths: list[int], row_length: int) -> list[list[int]]:
    """`first_fit`, longest first, into as few rows as rows of ``row_length`` need, each about equally full (the
    widest row sets the width of all)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    total, longest = sum(lengths), max(lengths, default=1)
    rows = -(-total // row_length) or 1
    width = max(longest, -(-total // rows))
    while True:  # a few tokens wider until first-fit needs no more rows than the fill allows
        placed = first_fit([lengths[i] for i in order], width)
        if len(placed) <= rows:
            return [[order[i] for i in row] for row in placed]
        width += max(1, longest // 4)


class RowForwards:
    """A learner's forwards over rollout rows (padded, or packed with ``packing`` where the micro-batch's padded layout
    wastes enough slots: `PACK_BELOW`), counting real and padded slots.

    ``real`` / ``slots``: input tokens that were sequence / all positions the forwards ran over since the last
    `reset`; ``1 - real / slots`` is the padding fraction (the ``pad_frac`` metric).
    """

    def __init__(self, packing: bool, temperature: float, pad_id: int = 0) -> None:
        self.packing, self.temperature, self.pad_id = packing, temperature, pad_id
        self.real = self.slots = 0

    @classmethod
    def of(cls, policy: PolicyRank, packing: bool, temperature: float) -> RowForwards:
        """Forwards for ``policy``'s learner; with ``packing``, first checks that its attention keeps packed
        sequences apart (`check_packing`, collective like every forward)."""
        config = getattr(policy.model, "config", None)
        if packing:
            check_packing(policy.model, int(config.vocab_size))  # type: ignore[union-attr]
        return cls(packing, temperature, int(getattr(config, "pad_token_id", None) or 0))

    def reset(self) -> None:
        self.real = self.slots = 0

    def metrics(self) -> dict[str, float]:
        """``pad_frac``: the share of the forwards' input slots (every rank's, since `reset`) that were padding."""
        real, slots = global_sum([float(self.real), float(self.slots)])
        return {"pad_frac": 1.0 - real / slots if slots else 0.0}

    def logprobs(self, model: nn.Module, rows: RolloutBatch) -> torch.Tensor:
        """``log p(response token | prefix)`` at the temperature, ``[B, R]`` (0 at padding)."""
        packed = self._pack(rows)
        if packed is None:
            return response_logprobs(model, rows, self.temperature)
        logits = model(**packed.inputs.model_inputs()).logits
        logp_N = token_logprobs(packed.take(logits).unsqueeze(0), packed.labels_N.unsqueeze(0), self.temperature)
        return packed.to_BR(logp_N.squeeze(0))

    def values(self, critic: nn.Module, rows: RolloutBatch) -> torch.Tensor:
        """The critic's ``V`` of the state before each response token, ``[B, R]`` (0 at padding)."""
        packed = self._pack(rows)
        if packed is None:
            return response_values(critic, rows)
        inputs = packed.inputs
        values = critic(input_ids=inputs.input_ids_BT, attention_mask=None, position_ids=inputs.position_ids_BT)
        return packed.to_BR(packed.take(values).to(rows.response_mask_BR.device))

    def _pack(self, rows: RolloutBatch) -> PackedRows | None:
        """``rows`` packed, where packing is on and saves enough (`PACK_BELOW`); else None (run them padded). Counts
        the slots of the layout chosen."""
        real = int(rows.prompt_mask_BP.sum() + rows.response_mask_BR.sum())
        padded = rows.prompt_ids_BP.numel() + rows.response_ids_BR.numel()
        # Packed rows hold at least the real tokens: a batch with little padding is not worth packing.
        packed = pack_rows(rows, self.pad_id) if self.packing and real < PACK_BELOW * padded else None
        if packed is None or packed.inputs.input_ids_BT.numel() >= PACK_BELOW * padded:
            self.real, self.slots = self.real + real, self.slots + padded
            return None
        self.real += int((packed.inputs.doc_ids_BT > 0).sum())
        self.slots += packed.inputs.input_ids_BT.numel()
        return packed


def balanced_shares(batch: RolloutBatch, world: int) -> list[torch.Tensor]:
    """Rows ``0..B-1`` of ``batch`` dealt to ``world`` ranks in equal numbers with about equal token sums: longest first,
    in snake order (0, 1, .., w-1, w-1, .., 0), each share ascending. Equal row counts keep every rank's number of
    forwards the same (FSDP's collectives must line up)."""
    lengths_B, n = batch.prompt_mask_BP.sum(1) + batch.response_mask_BR.sum(1), len(batch)
    if n % world:
        raise ValueError(f"a step of {n} rows does not split evenly over {world} learner ranks; make "
                         "algorithm.prompts_per_step a multiple of learner.num_workers")
    order = torch.sort(lengths_B, descending=True, stable=True).indices
    lap = torch.arange(n) % (2 * world)
    owner = torch.where(lap < world, lap, 2 * world - 1 - lap)
    return [order[owner == r].sort().values for r in range(world)]
