"""Rollout rows packed for one forward: `pack_rows` lays a `RolloutBatch`'s real tokens end to end (`PackedRows`).

A `RolloutBatch` is left-padded prompts beside right-padded responses, so a micro-batch's
forward runs over ``B x (P + R)`` slots however short most rows are. Packed, the rows' real
tokens (prompt, then response) are laid end to end with positions restarting at 0 for each
row, placed as SFT packs (`toolbox.data.packing`: first-fit, no 2-D mask, so transformers builds a
block-diagonal causal mask from the restarts); each response token's log-prob (or value) is read
at the position that predicts it and put back at its ``[B, R]`` place. The numbers equal the
padded forward's up to float rounding (same tokens, same positions, same causal context).

Shared prompts (``learner.share_prompts``, on by default with packing): the samples of one prompt (a GRPO group)
are laid out as the prompt once, then each response at the positions that follow it, and a 4-D attention mask lets
each response token see the prompt and its own earlier tokens only. The prompt's hidden states are the ones every
sample would compute for itself (same tokens, positions and causal context), and its gradient is the sum of the
samples' — the padded numbers again, with the prompt's forward and backward run once per group: the default
experiment's 128 rows of 5 prompt and 1-4 response tokens take ~400 slots instead of ~1,100 (about a fifth less
learner CPU a step: `toolbox bench learner_step --models grpo_tiny`). The shared-prefix idea of "Prefix Grouper" (2025) for GRPO; written by hand because
transformers only takes the mask, and the layout is `pack_rows`' own.

Not covered: a response whose mask has holes (packing keeps a row's first ``mask.sum()`` response
tokens, so it refuses one), and attention that ignores restarted positions (`check_packing` at start)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from toolbox.data.packing import TokenBatch, first_fit
from toolbox.rl.batch import RolloutBatch


@dataclass
class PackedRows:
    """A batch's sequences packed into rows, and where each response token's predictor sits.

    ``at_N`` (packed row, column) of the position whose output predicts response token ``n``;
    ``to_N`` (batch row, response column) where it belongs in ``[B, R]``; ``labels_N`` the token;
    ``allowed`` (shared prompts only) ``[rows, L, L]``, which slot each slot attends (`pack_rows`).
    """

    inputs: TokenBatch
    at_N: tuple[torch.Tensor, torch.Tensor]
    to_N: tuple[torch.Tensor, torch.Tensor]
    labels_N: torch.Tensor
    shape_BR: tuple[int, int]
    allowed: torch.Tensor | None = None

    def model_inputs(self, mask_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor | bool | None]:
        """The forward's keyword arguments. With shared prompts the attention mask is 4-D, as transformers takes a
        prepared one: boolean (sdpa) where ``mask_dtype`` is None, else additive in that dtype (eager attention)."""
        inputs = self.inputs.model_inputs()
        if self.allowed is not None:
            mask = self.allowed.unsqueeze(1)
            if mask_dtype is not None:
                mask = torch.zeros(mask.shape, dtype=mask_dtype).masked_fill(~mask, torch.finfo(mask_dtype).min)
            inputs["attention_mask"] = mask
        return inputs

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
# 2 CPU cores with `toolbox bench learner_step` and this constant varied (one GRPO micro-batch, forward + backward,
# padded = 1): grpo_tiny 32 rows of <= 9 tokens, rows of
# 9 / 64 / 224 tokens 1.35 / 0.88 / 0.59; `toolbox bench learner_step`'s "medium", 8 rows of <= 80 tokens, rows of
# 65 / 151 / 297 tokens 0.69 / 0.47 / 0.52.
ROW_TOKENS = 256


# Rows of shared-prompt units (`pack_rows`) are about this many units long (at least the longest unit, at most
# `ROW_TOKENS`): a unit is already many sequences long, and a row's attention costs L x L. Measured on 2 CPU cores with
# `toolbox bench learner_step --models grpo_tiny` and this constant varied (one GRPO update of the default
# experiment's 16 prompts x 8 samples, units of 15-37 tokens, learner CPU): 1 / 1.5 / 2 /
# 3 units and rows of 256 tokens 15.5 / 11.7-12.2 / 11.9-12.0 / 12.1-12.4 / 13.4-13.9 ms.
SHARED_ROW_UNITS = 2.0


def pack_rows(batch: RolloutBatch, pad_id: int = 0, row_length: int | None = None,
              share_prompts: bool = False) -> PackedRows:
    """The batch's sequences packed into rows of ``row_length`` tokens (default: `ROW_TOKENS`, or the longest
    sequence where that is longer).

    A row with no response token (masked out of the loss) is left out: nothing of it is read. Placement is SFT's
    `first_fit` (longest first); the rows are laid out with tensor ops rather than through `pack_examples`'
    per-token Python lists, which cost as much as a tiny model's forward (measured: 15 ms for 32 rows under load).

    ``share_prompts``: rows with the same prompt tokens (a GRPO group) are laid out as one *unit*, the prompt once
    and then each row's response, every response at the positions that follow the prompt; `PackedRows.allowed`
    then says which token sees which (a response its prompt and its own earlier tokens, never a sibling). A unit
    holds as many of the rows as fit in ``row_length``; the rest start another unit. Without a ``row_length``,
    rows of units are `SHARED_ROW_UNITS` units long. Where no two rows share a
    prompt the layout is the plain one (``allowed`` None: the restarted positions carry the boundaries).
    """
    prompt_B, response_B = sequence_lengths(batch)
    keep_B = response_B > 0
    units, unit_lengths, row_length, share_prompts = _plan_units(batch, prompt_B, response_B, keep_B, row_length,
                                                                 share_prompts)
    where = _slots(units, unit_lengths, prompt_B.tolist(), response_B.tolist(), row_length, len(batch))
    row_B, prompt_at_B, response_at_B, doc_B = torch.tensor(where, dtype=torch.long).reshape(-1, 4).unbind(1)
    first_B = torch.zeros(len(batch), dtype=torch.bool)
    first_B[[u[0] for u in units]] = True
    ids_BS = torch.cat([batch.prompt_ids_BP, batch.response_ids_BR], 1)
    mask_BS = torch.cat([batch.prompt_mask_BP.bool() & first_B.unsqueeze(1), batch.response_mask_BR.bool()], 1)
    mask_BS &= keep_B.unsqueeze(1)
    # a token's place in its sequence: prompt (left-padded), then response
    pos_BS = torch.cat([batch.prompt_mask_BP, batch.response_mask_BR], 1).long().cumsum(1) - 1
    # where position 0 of the row's sequence would sit: its prompt's start; for its response, the response's start
    # less the prompt length (the two agree unless the prompt is shared)
    width_P = batch.prompt_ids_BP.shape[1]
    origin_BS = torch.cat([prompt_at_B.unsqueeze(1).expand(-1, width_P),
                           (response_at_B - prompt_B).unsqueeze(1).expand(-1, ids_BS.shape[1] - width_P)], 1)
    b_N, s_N = mask_BS.nonzero(as_tuple=True)
    dest = (row_B[b_N], origin_BS[b_N, s_N] + pos_BS[b_N, s_N])
    unit_ends = [prompt_at_B[u[0]] + unit_lengths[i] for i, u in enumerate(units)]
    width = max(max((int(e) for e in unit_ends), default=1), 1)
    shape = (max(int(row_B.max()) + 1 if units else 1, 1), width)
    ids, pos, doc = torch.full(shape, pad_id, dtype=torch.long), torch.zeros(shape, dtype=torch.long), torch.zeros(
        shape, dtype=torch.long)
    ids[dest], pos[dest], doc[dest] = ids_BS[b_N, s_N], pos_BS[b_N, s_N], doc_B[b_N]
    inputs = TokenBatch(ids, doc.clamp(max=1), pos, doc, packed=True)
    allowed = None
    if share_prompts:  # which sequence each slot is: 0 a prompt, b + 1 the response of batch row b
        seq = torch.zeros(shape, dtype=torch.long)
        seq[dest] = torch.where(s_N >= width_P, b_N + 1, 0)
        allowed = _shared_prompt_mask(doc, seq)
    # Response token j of row b is predicted by its response's token j - 1, token 0 by the prompt's last token.
    rb_N, rj_N = batch.response_mask_BR.bool().nonzero(as_tuple=True)
    at_N = torch.where(rj_N > 0, response_at_B[rb_N] + rj_N - 1, prompt_at_B[rb_N] + prompt_B[rb_N] - 1)
    return PackedRows(inputs, (row_B[rb_N], at_N), (rb_N, rj_N), batch.response_ids_BR[rb_N, rj_N],
                      (len(batch), int(batch.response_ids_BR.shape[1])), allowed)


def _plan_units(batch: RolloutBatch, prompt_B: torch.Tensor, response_B: torch.Tensor, keep_B: torch.Tensor,
                row_length: int | None, share_prompts: bool) -> tuple[list[list[int]], list[int], int, bool]:
    """What `pack_rows` places: the units (rows sharing one prompt copy, or one row each where no two rows share a
    prompt), each unit's length in tokens, the packed rows' length, and whether prompts are shared."""
    lengths_B = (prompt_B + response_B) * keep_B
    length = max(max(lengths_B.tolist(), default=1), row_length or ROW_TOKENS, 1)
    units = _units(batch, prompt_B, response_B, keep_B, length) if share_prompts else None
    if units is None or all(len(u) == 1 for u in units):
        units = [[b] for b in range(len(batch)) if keep_B[b]]
        share_prompts = False
    prompts, responses = prompt_B.tolist(), response_B.tolist()
    unit_lengths = [prompts[u[0]] + sum(responses[b] for b in u) for u in units]
    if share_prompts and row_length is None:
        length = min(length, max(max(unit_lengths), math.ceil(SHARED_ROW_UNITS * sum(unit_lengths) / len(units))))
    return units, unit_lengths, length, share_prompts


def _slots(units: list[list[int]], unit_lengths: list[int], prompts: list[int], responses: list[int],
           row_length: int, rows: int) -> list[tuple[int, int, int, int]]:
    """Each batch row's (packed row, where its prompt starts, where its response starts, unit number in the packed
    row), the units placed into rows of ``row_length`` (`_placement`); a shared prompt's copy is the one of its
    unit's first row. A row left out of every unit keeps ``(0, 0, 0, 0)``."""
    where = [(0, 0, 0, 0)] * rows
    for row, items in enumerate(_placement(unit_lengths, row_length)):
        at = 0
        for d, i in enumerate(items, start=1):
            start = at + prompts[units[i][0]]
            for b in units[i]:
                where[b] = (row, at, start, d)
                start += responses[b]
            at += unit_lengths[i]
    return where


def _units(batch: RolloutBatch, prompt_B: torch.Tensor, response_B: torch.Tensor, keep_B: torch.Tensor,
           row_length: int) -> list[list[int]]:
    """The kept rows in units sharing one prompt copy: rows with equal prompt tokens, in batch order, as many to a
    unit as fit in ``row_length`` tokens (prompt + their responses)."""
    prompts = torch.where(batch.prompt_mask_BP.bool(), batch.prompt_ids_BP, -1)
    _, key_B = torch.unique(prompts, dim=0, return_inverse=True)
    units: list[list[int]] = []
    open_unit: dict[int, tuple[list[int], int]] = {}  # prompt key -> (its unit being filled, tokens in it)
    for b, (key, p, r, keep) in enumerate(zip(key_B.tolist(), prompt_B.tolist(), response_B.tolist(),
                                              keep_B.tolist(), strict=True)):
        if not keep:
            continue
        unit, used = open_unit.get(key, (None, 0))
        if unit is None or used + r > row_length:
            unit, used = [], p
            units.append(unit)
        unit.append(b)
        open_unit[key] = (unit, used + r)
    return units


def _shared_prompt_mask(doc_RL: torch.Tensor, seq_RL: torch.Tensor) -> torch.Tensor:
    """``[rows, L, L]``, True where the query slot may attend the key slot: the same unit, not later, and the key in
    the unit's prompt or in the query's own response. A padding slot sees itself only (no fully masked row)."""
    idx = torch.arange(doc_RL.shape[1])
    same_unit = (doc_RL.unsqueeze(2) == doc_RL.unsqueeze(1)) & (doc_RL > 0).unsqueeze(2)
    visible = (seq_RL.unsqueeze(1) == 0) | (seq_RL.unsqueeze(2) == seq_RL.unsqueeze(1))
    return (same_unit & visible & (idx.unsqueeze(1) >= idx.unsqueeze(0))) | torch.eye(len(idx), dtype=torch.bool)


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
