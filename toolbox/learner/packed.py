"""The RL learners' forwards over rollout rows, padded or packed (`toolbox.learner.row_packing`) where the
micro-batch's padded layout wastes enough slots, and how much of them was padding; the ranks' shares of a batch,
balanced by tokens; and the start-up check that the model's attention takes shared prompts."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from toolbox.data.packing import check_packing, logit_tolerance
from toolbox.learner.collective import global_sum
from toolbox.learner.row_packing import PackedRows, pack_rows
from toolbox.models.logprobs import response_logprobs, token_logprobs
from toolbox.models.value import response_values
from toolbox.rl.batch import RolloutBatch

if TYPE_CHECKING:
    from toolbox.learner.policy import PolicyRank

log = logging.getLogger(__name__)


# A micro-batch is packed only when its packed rows fill less than this share of the padded layout's slots. Packed rows
# are longer, and a row's attention costs L x L however much of it the block-diagonal mask discards, so packing a batch
# with little padding loses. Measured with one torch thread on the rows of `toolbox bench grpo_train_vs_trl --short N`
# ("small", 8 rows of 8-16 prompt tokens, one GRPO update, CPU time, packed / padded): responses of 64 tokens (padded
# layout 4% padding) 1.11, of 32-64 (14%) 1.02, of 16-64 (40%) 0.77, of 1-64 (54%) 0.52.
PACK_BELOW = 0.8


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
