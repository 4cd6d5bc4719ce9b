"""Helpers the non-HF engines (vllm, sglang, http) share: completions -> `RolloutBatch`, finish reasons, seeds.

Each of those engines receives a completion per request as token-id and log-prob lists; this module turns
them into one batch, maps finish reasons, draws per-request seeds and counts the bytes of a weight update;
`check_engine_gpus` checks at config load that a rollout worker reserves the GPUs its engine shards over,
`engine_dtype` picks the dtype an engine computes in (``rollout.dtype``), and `ParallelEngineOptions` keeps
``engine_kwargs`` from repeating an argument the engine passes itself.
Not here: anything about a backend's own API (in its module), or the hf engine's tensor-level path.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel, field_validator

from toolbox.core.errors import ConfigError
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, PromptRequest, RolloutBatch


@dataclass(frozen=True)
class Sample:
    """One completion: response token ids, the behaviour log-prob of each, and a finish code.

    ``own_mask`` (1: the model's own token) is for responses that interleave other tokens (a multi-turn
    episode's environment turns); ``None`` means every token is the model's.
    """

    ids: list[int]
    logprobs: list[float]
    finish: int
    own_mask: list[int] | None = None


def finish_code(reason: Any, where: str) -> int:
    """Map an engine's finish reason ("stop" / "length") to FINISH_STOP / FINISH_LENGTH.

    Anything else (an abort, a content filter, None) is an infrastructure failure, never a
    silently short sample, so it raises.
    """
    if reason == "stop":
        return FINISH_STOP
    if reason == "length":
        return FINISH_LENGTH
    raise RuntimeError(f"{where}: generation ended with finish reason {reason!r}; expected 'stop' or 'length'")


def call_rng() -> random.Random:
    """A stream for one generate call's request seeds, seeded by one draw from the process's global torch generator.

    A rollout worker's checkpointed RNG state is its process's global streams (`toolbox.core.seeding.rng_state`),
    so seeds drawn this way come back on resume: a resumed run sends the server the seeds the uninterrupted run
    sent (an engine-private ``random.Random(seed)`` would restart from ``seed`` instead)."""
    return random.Random(int(torch.randint(0, 2**62, (1,)).item()))


def request_seeds(rng: random.Random, n: int, seeded: bool = True) -> list[int | None]:
    """Distinct per-request seeds (rows of one group share a prompt and must not share a seed); all None when
    ``seeded`` is off, leaving sampling to the engine-level seed."""
    return [rng.randrange(2**31 - 1) for _ in range(n)] if seeded else [None] * n


def batch_from_samples(requests: list[PromptRequest], samples: list[Sample], pad_id: int) -> RolloutBatch:
    """Left-pad prompts, right-pad responses, and stack per-request samples into a `RolloutBatch`."""
    if len(samples) != len(requests):
        raise ValueError(f"engine returned {len(samples)} completions for {len(requests)} prompts")
    for i, s in enumerate(samples):
        if len(s.ids) != len(s.logprobs) or (s.own_mask is not None and len(s.own_mask) != len(s.ids)):
            raise ValueError(f"row {i}: {len(s.ids)} response tokens but {len(s.logprobs)} log-probs and "
                             f"{'no' if s.own_mask is None else len(s.own_mask)} own-mask entries")
    b = len(requests)
    p = max(len(r.ids) for r in requests)
    r = max(1, max(len(s.ids) for s in samples))
    prompt_ids = torch.full((b, p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((b, p), dtype=torch.long)
    response_ids = torch.full((b, r), pad_id, dtype=torch.long)
    response_mask = torch.zeros((b, r), dtype=torch.long)
    logprobs = torch.zeros((b, r), dtype=torch.float32)
    own_mask = torch.zeros((b, r), dtype=torch.long)
    for i, (req, s) in enumerate(zip(requests, samples)):
        prompt_ids[i, p - len(req.ids) :] = torch.tensor(req.ids, dtype=torch.long)
        prompt_mask[i, p - len(req.ids) :] = 1
        n = len(s.ids)
        response_ids[i, :n] = torch.tensor(s.ids, dtype=torch.long)
        response_mask[i, :n] = 1
        logprobs[i, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
        own_mask[i, :n] = 1 if s.own_mask is None else torch.tensor(s.own_mask, dtype=torch.long)
    return RolloutBatch(
        prompt_ids_BP=prompt_ids,
        prompt_mask_BP=prompt_mask,
        response_ids_BR=response_ids,
        response_mask_BR=response_mask,
        logprobs_BR=logprobs,
        group_B=torch.tensor([q.group for q in requests], dtype=torch.long),
        finish_B=torch.tensor([s.finish for s in samples], dtype=torch.long),
        extras=[q.extras for q in requests],
        own_mask_BR=None if all(s.own_mask is None for s in samples) else own_mask,
    )


def wire_dtype(tensor: torch.Tensor, engine_dtype: torch.dtype) -> torch.dtype:
    """The dtype ``tensor`` is handed to an engine in: the engine's for floating-point weights, its own for integer
    buffers."""
    return engine_dtype if tensor.is_floating_point() else tensor.dtype


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes held by ``tensors``: what a weight update reports it loaded."""
    return sum(t.numel() * t.element_size() for t in tensors)


def check_engine_gpus(engine: Any, gpus_per_worker: float) -> None:
    """A tensor-parallel engine (vllm ``tensor_parallel_size``, sglang ``tp_size``, times the pipeline stages of its
    ``engine_kwargs``) runs inside one rollout worker on the GPUs Ray gave that worker, so the worker must reserve
    exactly that many (fractions are for sharing one GPU)."""
    field = next((f for f in ("tensor_parallel_size", "tp_size") if hasattr(engine, f)), None)
    if field is None:
        return
    tp = int(getattr(engine, field))
    gpus = int(getattr(engine, "sync_workers", tp))  # tensor x pipeline parallel
    if (gpus > 1 or gpus_per_worker > 1) and gpus_per_worker != gpus:
        pipeline = f" (x {gpus // tp} pipeline stages)" if gpus != tp else ""
        raise ConfigError(f"rollout.engine.{field} is {tp}{pipeline} but rollout.gpus_per_worker is "
                          f"{gpus_per_worker:g}: each rollout worker runs one engine on the GPUs it reserves; set "
                          f"rollout.gpus_per_worker: {gpus}")


# Engines that run on GPUs only and compute in half precision by default (vLLM's flash attention takes fp16 / bf16).
HALF_PRECISION_ENGINES = ("vllm", "sglang")


def engine_dtype(engine: str, rollout_dtype: str, model_dtype: str) -> str:
    """The dtype rollout engines load the policy in: ``rollout.dtype``, where ``auto`` is bfloat16 for the GPU engines
    (vLLM, SGLang) and the learner's ``model.dtype`` for the others. The learner keeps its own precision either way:
    the weight sync casts to the engine's dtype."""
    if rollout_dtype != "auto":
        return rollout_dtype
    return "bfloat16" if engine in HALF_PRECISION_ENGINES else model_dtype


class ParallelEngineOptions(BaseModel):
    """What the vLLM and SGLang engine configs share: ``engine_kwargs`` may not repeat an argument the engine passes
    itself (Python would fail at start with "got multiple values for keyword argument"), and the engine's processes
    are its tensor x pipeline parallel degree. Each config names its own: ``RESERVED`` (key -> the setting to use
    instead), ``CALLEE``, ``TP_FIELD`` and ``PP_KEY``."""

    RESERVED: ClassVar[dict[str, str]] = {}
    CALLEE: ClassVar[str] = ""
    TP_FIELD: ClassVar[str] = ""
    PP_KEY: ClassVar[str] = ""
    if TYPE_CHECKING:
        engine_kwargs: dict[str, Any]

    @field_validator("engine_kwargs", check_fields=False)
    @classmethod
    def _not_reserved(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(cls.RESERVED.keys() & kwargs.keys())
        if clash:
            uses = "; ".join(f"{key}: set {cls.RESERVED[key]}" for key in clash)
            raise ValueError(f"rollout.engine.engine_kwargs: {', '.join(clash)} is passed to {cls.CALLEE} by toolbox "
                             f"({uses})")
        return kwargs

    @property
    def sync_workers(self) -> int:
        """The engine's worker processes, each a rank of a device-to-device sync group (and a GPU of the rollout
        worker): tensor x pipeline parallel."""
        return int(getattr(self, self.TP_FIELD)) * int(self.engine_kwargs.get(self.PP_KEY, 1))
