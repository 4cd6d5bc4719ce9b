"""`RolloutBatch`: the one currency between rollout, reward and learner roles."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from toolbox.core.wire import TensorFields

FINISH_STOP = 0  # the engine sampled EOS / a stop token
FINISH_LENGTH = 1  # max_new_tokens reached


@dataclass(frozen=True)
class PromptRequest:
    """One prompt to sample from: token ids, the group it belongs to, small metadata for the reward.

    The input of generation, as `RolloutBatch` is its output: an engine turns a list of these into a batch
    whose rows keep their order, ``group`` and ``extras``.
    """

    ids: list[int]
    group: int
    extras: dict[str, Any] = field(default_factory=dict)


SCALARS = ("seconds", "retries")  # RolloutBatch fields about the whole batch, not per row


@dataclass
class RolloutBatch(TensorFields):
    """A batch of sampled completions, shaped ``[B, P]`` (prompt) and ``[B, R]`` (response).

    Prompts are left-padded and responses right-padded, so ``cat([prompt_ids,
    response_ids], 1)`` is a valid model input with ``cat`` of the masks as the
    attention mask. ``logprobs_BR`` are the behaviour policy's per-token log-probs
    (0 at padding). ``group_B`` says which prompt each row was sampled from; rows of
    one group share a prompt. ``extras`` carries small per-row metadata (the task's
    reference answer) that the reward needs. ``seconds`` is how long the engine took to make
    it (a concatenation keeps the longest: shards are generated in parallel); ``retries`` how many
    calls its worker retried meanwhile (`toolbox.core.retry.take_retries`; a concatenation sums them).

    ``own_mask_BR`` is 1 on the model's own response tokens and 0 on the environment's (a
    multi-turn episode's tool results and user turns, which stay in ``response_mask_BR`` so
    attention still sees them); ``None``: every response token is the model's. Learners train
    on ``loss_mask_BR``, the response tokens that are the model's own.
    """

    prompt_ids_BP: torch.Tensor
    prompt_mask_BP: torch.Tensor
    response_ids_BR: torch.Tensor
    response_mask_BR: torch.Tensor
    logprobs_BR: torch.Tensor
    group_B: torch.Tensor
    finish_B: torch.Tensor
    extras: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    own_mask_BR: torch.Tensor | None = None
    retries: int = 0

    def __post_init__(self) -> None:
        if self.own_mask_BR is not None and self.own_mask_BR.shape != self.response_mask_BR.shape:
            raise ValueError(f"RolloutBatch.own_mask_BR has shape {tuple(self.own_mask_BR.shape)}, expected "
                             f"{tuple(self.response_mask_BR.shape)} (that of response_mask_BR)")
        b = self.prompt_ids_BP.shape[0]
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SCALARS or value is None:
                continue
            n = value.shape[0] if isinstance(value, torch.Tensor) else len(value)
            if n != b and not (f.name == "extras" and n == 0):
                raise ValueError(f"RolloutBatch.{f.name} has {n} rows, expected {b}")

    def __len__(self) -> int:
        return int(self.prompt_ids_BP.shape[0])

    def model_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask, position_ids)`` of prompt + response, ``[B, P + R]``.

        Left padding: positions count real tokens only, as ``generate()`` does.
        """
        ids = torch.cat([self.prompt_ids_BP, self.response_ids_BR], dim=1)
        attn = torch.cat([self.prompt_mask_BP, self.response_mask_BR], dim=1)
        return ids, attn, (attn.cumsum(dim=1) - 1).clamp(min=0)

    @property
    def response_lengths_B(self) -> torch.Tensor:
        return self.response_mask_BR.sum(dim=1)

    @property
    def loss_mask_BR(self) -> torch.Tensor:
        """The response tokens a policy loss counts: the model's own (a row masked out of the response is out)."""
        return self.response_mask_BR if self.own_mask_BR is None else self.response_mask_BR * self.own_mask_BR

    def select(self, index: slice | torch.Tensor) -> RolloutBatch:
        """Rows ``index`` (a slice or an index tensor) as a new batch."""
        rows = list(range(len(self)))[index] if isinstance(index, slice) else index.tolist()
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SCALARS or value is None:
                out[f.name] = value
            elif isinstance(value, torch.Tensor):
                out[f.name] = value[index]
            else:
                out[f.name] = [value[i] for i in rows] if value else []
        return RolloutBatch(**out)

    def trimmed(self) -> RolloutBatch:
        """The batch without the padding columns all its rows share: prompt columns on the left, response columns
        on the right (rows cut from a larger batch keep its widths)."""
        used_p = self.prompt_mask_BP.any(0).nonzero()
        start = int(used_p[0]) if len(used_p) else self.prompt_ids_BP.shape[1]
        used_r = self.response_mask_BR.any(0).nonzero()
        end = int(used_r[-1]) + 1 if len(used_r) else 0
        if start == 0 and end == self.response_ids_BR.shape[1]:
            return self
        return replace(self, prompt_ids_BP=self.prompt_ids_BP[:, start:], prompt_mask_BP=self.prompt_mask_BP[:, start:],
                       response_ids_BR=self.response_ids_BR[:, :end], response_mask_BR=self.response_mask_BR[:, :end],
                       logprobs_BR=self.logprobs_BR[:, :end],
                       own_mask_BR=None if self.own_mask_BR is None else self.own_mask_BR[:, :end])

    def split(self, n: int) -> list[RolloutBatch]:
        """``n`` contiguous shards whose sizes differ by at most one row."""
        if n < 1:
            raise ValueError(f"cannot split a batch into {n} shards")
        return self.split_sizes([len(self) // n + (1 if i < len(self) % n else 0) for i in range(n)])

    def split_sizes(self, sizes: list[int]) -> list[RolloutBatch]:
        """Contiguous shards of ``sizes`` rows, in order."""
        out, start = [], 0
        for size in sizes:
            out.append(self.select(slice(start, start + size)))
            start += size
        return out

    @staticmethod
    def concat(batches: list[RolloutBatch], pad_id: int = 0) -> RolloutBatch:
        """Stack shards; prompts are re-left-padded and responses re-right-padded to a common width."""
        if not batches:
            raise ValueError("concat of no batches")
        p = max(b.prompt_ids_BP.shape[1] for b in batches)
        r = max(b.response_ids_BR.shape[1] for b in batches)
        return RolloutBatch(
            prompt_ids_BP=torch.cat([_pad(b.prompt_ids_BP, p, pad_id, left=True) for b in batches]),
            prompt_mask_BP=torch.cat([_pad(b.prompt_mask_BP, p, 0, left=True) for b in batches]),
            response_ids_BR=torch.cat([_pad(b.response_ids_BR, r, pad_id, left=False) for b in batches]),
            response_mask_BR=torch.cat([_pad(b.response_mask_BR, r, 0, left=False) for b in batches]),
            logprobs_BR=torch.cat([_pad(b.logprobs_BR, r, 0, left=False) for b in batches]),
            group_B=torch.cat([b.group_B for b in batches]),
            finish_B=torch.cat([b.finish_B for b in batches]),
            extras=[e for b in batches for e in b.extras],
            seconds=max(b.seconds for b in batches),
            retries=sum(b.retries for b in batches),
            own_mask_BR=None if all(b.own_mask_BR is None for b in batches) else torch.cat(
                [_pad(b.loss_mask_BR, r, 0, left=False) for b in batches]),
        )


def _pad(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    gap = width - x.shape[1]
    if gap == 0:
        return x
    filler = torch.full((x.shape[0], gap), value, dtype=x.dtype)
    return torch.cat([filler, x] if left else [x, filler], dim=1)
