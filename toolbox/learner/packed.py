"""The RL learners' forwards over rollout rows, padded or packed, and how much of them was padding.

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
tokens, so it refuses one), and attention that ignores restarted positions (`check_packing` at start).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from toolbox.data.packing import TokenBatch, check_packing, first_fit, logit_tolerance
from toolbox.learner.collective import global_sum
from toolbox.models.logprobs import response_logprobs, token_logprobs
from toolbox.models.value import response_values
from toolbox.rl.batch import RolloutBatch

if TYPE_CHECKING:
    from toolbox.learner.policy import PolicyRank

log = logging.getLogger(__name__)


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
# A micro-batch is packed only when its packed rows fill less than this share of the padded layout's slots. Packed rows
# are longer, and a row's attention costs L x L however much of it the block-diagonal mask discards, so packing a batch
# with little padding loses. Measured with one torch thread on the rows of `toolbox bench grpo_train_vs_trl --short N`
# ("small", 8 rows of 8-16 prompt tokens, one GRPO update, CPU time, packed / padded): responses of 64 tokens (padded
# layout 4% padding) 1.11, of 32-64 (14%) 1.02, of 16-64 (40%) 0.77, of 1-64 (54%) 0.52.
PACK_BELOW = 0.8
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
    lengths_B = (prompt_B + response_B) * keep_B
    given = row_length
    row_length = max(max(lengths_B.tolist(), default=1), row_length or ROW_TOKENS, 1)
    units = _units(batch, prompt_B, response_B, keep_B, row_length) if share_prompts else None
    if units is None or all(len(u) == 1 for u in units):
        units = [[b] for b in range(len(batch)) if keep_B[b]]
        share_prompts = False
    prompts, responses = prompt_B.tolist(), response_B.tolist()
    unit_lengths = [prompts[u[0]] + sum(responses[b] for b in u) for u in units]
    if share_prompts and given is None:
        row_length = min(row_length, max(max(unit_lengths), math.ceil(SHARED_ROW_UNITS * sum(unit_lengths) / len(units))))
    where = _slots(units, unit_lengths, prompts, responses, row_length, len(batch))
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


class RowForwards:
    """A learner's forwards over rollout rows (padded, or packed with ``packing`` where the micro-batch's padded layout
    wastes enough slots: `PACK_BELOW`), counting real and padded slots. ``share_prompts``: packed with a group's
    prompt held once (`pack_rows`), the mask given as ``mask_dtype`` says (`PackedRows.model_inputs`).

    ``real`` / ``slots``: input tokens that were sequence / all positions the forwards ran over since the last
    `reset`; ``1 - real / slots`` is the padding fraction (the ``pad_frac`` metric).
    """

    def __init__(self, packing: bool, temperature: float, pad_id: int = 0, share_prompts: bool = False,
                 mask_dtype: torch.dtype | None = None) -> None:
        self.packing, self.temperature, self.pad_id = packing, temperature, pad_id
        self.share_prompts, self.mask_dtype = packing and share_prompts, mask_dtype
        self.real = self.slots = 0
        self._layouts: dict[tuple, tuple[list[torch.Tensor], PackedRows | None]] = {}

    @classmethod
    def of(cls, policy: PolicyRank, packing: bool, temperature: float, share_prompts: bool = False) -> RowForwards:
        """Forwards for ``policy``'s learner; with ``packing``, first checks that its attention keeps packed
        sequences apart (`check_packing`, collective like every forward); with ``share_prompts`` too, that its
        attention takes the 4-D mask of shared prompts (`check_shared_prompts`), where its kind can
        (`shared_prompts_unsupported`) and no router loss needs a 2-D mask (`toolbox.learner.router`; where not, the
        prompts are not shared, and the log says why)."""
        config = getattr(policy.model, "config", None)
        pad_id = int(getattr(config, "pad_token_id", None) or 0)
        if not packing:
            return cls(False, temperature, pad_id)
        vocab = int(config.vocab_size)  # type: ignore[union-attr]
        check_packing(policy.model, vocab)
        why = shared_prompts_unsupported(policy.model) if share_prompts else "learner.share_prompts is off"
        if why is None and policy.router.on:
            why = "the mixture-of-experts router loss leaves padding out by a 2-D attention mask"
        if why is not None:
            if share_prompts:
                log.info("learner.share_prompts: each packed sequence keeps its own prompt copy (%s)", why)
            return cls(True, temperature, pad_id)
        sdpa = getattr(config, "_attn_implementation", None) == "sdpa"
        mask_dtype = None if sdpa else next(policy.model.parameters()).dtype
        forwards = cls(True, temperature, pad_id, share_prompts=True, mask_dtype=mask_dtype)
        check_shared_prompts(policy.model, vocab, forwards)
        return forwards

    def reset(self) -> None:
        """Start an update: counts from zero, no layout remembered (within an update, rows are not changed in place)."""
        self.real = self.slots = 0
        self._layouts.clear()

    def metrics(self) -> dict[str, float]:
        """``pad_frac``: the share of the forwards' input slots (every rank's, since `reset`) that were padding."""
        real, slots = global_sum([float(self.real), float(self.slots)])
        return {"pad_frac": 1.0 - real / slots if slots else 0.0}

    def logprobs(self, model: nn.Module, rows: RolloutBatch) -> torch.Tensor:
        """``log p(response token | prefix)`` at the temperature, ``[B, R]`` (0 at padding)."""
        packed = self._pack(rows)
        if packed is None:
            return response_logprobs(model, rows, self.temperature)
        logits = model(**packed.model_inputs(self.mask_dtype)).logits
        logp_N = token_logprobs(packed.take(logits).unsqueeze(0), packed.labels_N.unsqueeze(0), self.temperature)
        return packed.to_BR(logp_N.squeeze(0))

    def values(self, critic: nn.Module, rows: RolloutBatch) -> torch.Tensor:
        """The critic's ``V`` of the state before each response token, ``[B, R]`` (0 at padding)."""
        packed = self._pack(rows)
        if packed is None:
            return response_values(critic, rows)
        inputs = packed.model_inputs(self.mask_dtype)
        values = critic(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                        position_ids=inputs["position_ids"])
        return packed.to_BR(packed.take(values).to(rows.response_mask_BR.device))

    def _pack(self, rows: RolloutBatch) -> PackedRows | None:
        """``rows`` packed, where packing is on and saves enough (`PACK_BELOW`); else None (run them padded). Counts
        the slots of the layout chosen. A micro-batch's layout is made once per update (`reset`) and reused by its
        next forwards (the reference's, then the training pass's): the rows are views of the same tensors, known by
        their memory, which the remembered entry keeps alive so that no other tensor can take its place."""
        tensors = [rows.prompt_ids_BP, rows.prompt_mask_BP, rows.response_ids_BR, rows.response_mask_BR]
        key = tuple((t.data_ptr(), t.shape, t.stride()) for t in tensors)
        if key not in self._layouts:
            self._layouts[key] = (tensors, self._layout(rows))
        packed = self._layouts[key][1]
        if packed is None:
            self.real += int(rows.prompt_mask_BP.sum() + rows.response_mask_BR.sum())
            self.slots += rows.prompt_ids_BP.numel() + rows.response_ids_BR.numel()
        else:
            self.real += int((packed.inputs.doc_ids_BT > 0).sum())
            self.slots += packed.inputs.input_ids_BT.numel()
        return packed

    def _layout(self, rows: RolloutBatch) -> PackedRows | None:
        real = int(rows.prompt_mask_BP.sum() + rows.response_mask_BR.sum())
        padded = rows.prompt_ids_BP.numel() + rows.response_ids_BR.numel()
        # Packed rows hold at least the real tokens: a batch with little padding is not worth packing, unless its
        # rows share prompts, each held once then (a GRPO step's prompts are often all of one length: no padding).
        worth = self.share_prompts or real < PACK_BELOW * padded
        packed = pack_rows(rows, self.pad_id, share_prompts=self.share_prompts) if self.packing and worth else None
        if packed is None or packed.inputs.input_ids_BT.numel() >= PACK_BELOW * padded:
            return None
        return packed


def balanced_shares(batch: RolloutBatch, world: int, by_group: bool = False) -> list[torch.Tensor]:
    """Rows ``0..B-1`` of ``batch`` dealt to ``world`` ranks in equal numbers with about equal token sums: longest first,
    in snake order (0, 1, .., w-1, w-1, .., 0), each share ascending. Equal row counts keep every rank's number of
    forwards the same (FSDP's collectives must line up).

    ``by_group`` (shared prompts): whole groups (``group_B``) are dealt, weighed by their prompt once and their
    responses, so that a group's samples share one prompt copy on one rank; where the groups are not all of one
    size or do not split evenly over the ranks, rows are dealt as without it."""
    n = len(batch)
    if n % world:
        raise ValueError(f"a step of {n} rows does not split evenly over {world} learner ranks; make "
                         "algorithm.prompts_per_step a multiple of learner.num_workers")
    if world == 1:
        return [torch.arange(n)]
    if by_group:
        groups, group_B, sizes = torch.unique(batch.group_B, return_inverse=True, return_counts=True)
        if len(groups) % world == 0 and bool((sizes == sizes[0]).all()):
            first_G = torch.full((len(groups),), n).scatter_reduce(0, group_B, torch.arange(n), reduce="amin")
            weight_G = batch.prompt_mask_BP[first_G].sum(1) + torch.zeros(len(groups), dtype=torch.long).index_add(
                0, group_B, batch.response_mask_BR.sum(1))
            owner_G = _snake(weight_G, world)
            return [(owner_G[group_B] == r).nonzero().flatten() for r in range(world)]
    owner = _snake(batch.prompt_mask_BP.sum(1) + batch.response_mask_BR.sum(1), world)
    return [(owner == r).nonzero().flatten() for r in range(world)]


def _snake(weights: torch.Tensor, world: int) -> torch.Tensor:
    """The rank each item goes to: heaviest first, dealt in snake order (0, 1, .., w-1, w-1, .., 0)."""
    order = torch.sort(weights, descending=True, stable=True).indices
    lap = torch.arange(len(weights)) % (2 * world)
    owner = torch.empty(len(weights), dtype=torch.long)
    owner[order] = torch.where(lap < world, lap, 2 * world - 1 - lap)
    return owner


def shared_prompts_unsupported(model: nn.Module) -> str | None:
    """Why ``model``'s attention cannot take `pack_rows`' shared-prompt mask (None: it can): transformers passes a
    4-D mask through to sdpa and eager attention, not to flash or flex kernels (they read positions, not masks), and
    one mask for every layer would drop a sliding window."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ("sdpa", "eager"):
        return f"attention implementation {impl!r} takes no 4-D mask; sdpa and eager do"
    if "sliding_attention" in (getattr(config, "layer_types", None) or []) or (
            getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)):
        return "sliding-window attention"
    return None


def check_shared_prompts(model: nn.Module, vocab_size: int, forwards: RowForwards, tol: float | None = None) -> None:
    """Raise if ``model`` gives two responses that share a packed prompt other log-probs than padded rows do (its
    forward ignores the 4-D mask). ``tol``: as `check_packing`'s."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab_size, (1, 3), generator=gen).expand(2, 3)
    response = torch.randint(0, vocab_size, (2, 3), generator=gen)
    rmask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rows = RolloutBatch(prompt.clone(), torch.ones(2, 3, dtype=torch.long), response * rmask, rmask,
                        torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            packed = pack_rows(rows, forwards.pad_id, share_prompts=True)
            logits = model(**packed.model_inputs(forwards.mask_dtype)).logits
            tol = logit_tolerance(logits) if tol is None else tol
            shared = packed.to_BR(token_logprobs(packed.take(logits).unsqueeze(0), packed.labels_N.unsqueeze(0)).squeeze(0))
            alone = response_logprobs(model, rows, 1.0)
    finally:
        model.train(was_training)
    err = float((shared - alone).abs().max())
    if packed.allowed is None or err > tol:
        raise RuntimeError(f"{type(model).__name__} gives responses sharing a packed prompt other log-probs than padded "
                           f"rows (max difference {err:.2e}): its forward does not honour a 4-D attention mask; set "
                           "learner.share_prompts=false")
