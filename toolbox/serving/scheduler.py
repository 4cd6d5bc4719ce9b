"""Continuous batching for a ``transformers`` causal LM: one scheduler thread, one running batch, one KV cache.

Each loop of the scheduler thread is one step boundary: it admits waiting sequences (up to
``max_batch_size`` running), prefills the newcomers together (left-padded) and samples their first tokens,
merges their cache into the running batch's (`toolbox.serving.kv`), then runs one decode step over every
running row and drops the rows that finished. So a request that arrives while others are decoding joins them
at the next step instead of waiting for the batch to drain. Weight loads and digests take the same lock as a
step, so they happen between steps; rows still running keep the KV entries computed with the old weights.

Not covered: paged attention, prefix caching, chunked prefill, preemption. Memory grows with the longest
running row times the batch size.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from toolbox.serving.kv import BatchKV, check_cache, keep_rows, merge
from toolbox.serving.sampling import choose
from toolbox.serving.sequence import Sequence

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The waiting queue has no room for all of a request's choices."""


class BatchLoop:
    """One thread that owns a generator while serving: a bounded waiting queue, admission at step boundaries.

    Subclasses implement `_step` (what one loop does with the newly admitted sequences); ``_running`` holds the
    sequences still generating between steps (always empty for a backend that finishes a batch in one step).
    """

    def __init__(self, max_batch_size: int, max_queue: int, name: str) -> None:
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.lock = threading.Lock()  # held for a step; weight loads take it too
        self._wake = threading.Condition()
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._stopped = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.steps = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
        self._thread.join(timeout=30)

    def submit(self, sequences: list[Sequence]) -> None:
        """Queue all of one request's choices, or none: `QueueFull` if they do not all fit in ``max_queue``."""
        if self._failure is not None:
            raise RuntimeError(f"the scheduler thread died: {self._failure!r}") from self._failure
        with self._wake:
            room = self.max_queue - len(self._waiting)
            if len(sequences) > room:
                raise QueueFull(f"{len(self._waiting)} choices already waiting (max_queue={self.max_queue}); "
                                f"this request needs room for {len(sequences)}")
            self._waiting.extend(sequences)
            self._wake.notify_all()

    def run_between_steps(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` while no step runs (weight loads, digests)."""
        with self.lock:
            return fn()

    def _loop(self) -> None:
        try:
            while True:
                with self._wake:
                    while not self._stopped and not self._waiting and not self._running:
                        self._wake.wait()
                    if self._stopped:
                        return
                    room = self.max_batch_size - len(self._running)
                    newcomers = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
                with self.lock, torch.no_grad():
                    self._step([s for s in newcomers if not s.cancelled])
        except BaseException as err:  # the thread must not die silently: requests would hang
            log.exception("toolbox serve: the scheduler thread failed")
            self._failure = err
            for seq in [*self._running, *self._waiting]:
                seq.listener(err)

    def _step(self, newcomers: list[Sequence]) -> None:
        raise NotImplementedError


class ContinuousBatcher(BatchLoop):
    """Owns the model while serving: admits sequences, runs prefill and decode steps, loads weights between steps."""

    def __init__(self, model: nn.Module, pad_id: int, max_batch_size: int = 32, max_queue: int = 256) -> None:
        super().__init__(max_batch_size, max_queue, "toolbox-serve-scheduler")
        self.model = model
        self.device = next(model.parameters()).device
        self.pad_id = pad_id
        self._kv: BatchKV | None = None
        self.peak_running = 0  # the most rows ever decoded together (tests read it)

    def _step(self, newcomers: list[Sequence]) -> None:
        """Prefill the newcomers, decode the rows that were already running, then drop finished rows."""
        old = [s for s in self._running]
        if old:
            self._decode(old)
        if newcomers:
            self._kv = merge(self._kv, self._prefill(newcomers))
            self._running = old + newcomers
            self.peak_running = max(self.peak_running, len(self._running))
        self.steps += 1
        keep = [i for i, s in enumerate(self._running) if not s.done]
        if len(keep) < len(self._running) and self._kv is not None:
            self._kv = keep_rows(self._kv, keep)
            self._running = [self._running[i] for i in keep]

    def _prefill(self, seqs: list[Sequence]) -> BatchKV:
        width = max(len(s.prompt_ids) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long, device=self.device)
        mask = torch.zeros((len(seqs), width), dtype=torch.long, device=self.device)
        for i, s in enumerate(seqs):
            ids[i, width - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids, device=self.device)
            mask[i, width - len(s.prompt_ids) :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache(config=getattr(self.model, "config", None))
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                            use_cache=True, logits_to_keep=1).logits
        check_cache(cache)  # the forward pass filled ``cache`` in place
        self._sample(seqs, logits[:, -1])
        return BatchKV(cache, mask)

    def _decode(self, seqs: list[Sequence]) -> None:
        assert self._kv is not None
        kv = self._kv
        kv.mask_BL = torch.cat([kv.mask_BL, torch.ones((kv.size, 1), dtype=torch.long, device=self.device)], dim=1)
        last = torch.tensor([[s.last_token] for s in seqs], dtype=torch.long, device=self.device)
        positions = kv.mask_BL.sum(dim=1, keepdim=True) - 1
        logits = self.model(input_ids=last, attention_mask=kv.mask_BL, position_ids=positions, cache=kv.cache,
                            use_cache=True).logits
        self._sample(seqs, logits[:, -1])

    @staticmethod
    def _sample(seqs: list[Sequence], logits_BV: torch.Tensor) -> None:
        # Sampling runs on the CPU, where each choice's seeded generator lives.
        for seq, logits in zip(seqs, logits_BV.float().cpu(), strict=True):
            if seq.done:
                continue
            p = seq.params
            seq.append(choose(logits, p.temperature, p.top_p, seq.generator, p.num_top))
