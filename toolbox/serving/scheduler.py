"""Continuous batching for a causal LM: one scheduler thread, one running batch, one KV cache.

Each loop of the scheduler thread is one step boundary: one decode step of every running row, then the
newcomers (up to ``max_batch_size`` running) prefilled together into the same cache (`toolbox.serving.kv`: the
lean decode loop's decoders where the model has one), then one vectorised sampling of every row's next token
(`toolbox.serving.sampling`), the EOS / ``max_tokens`` checks on tensors, and the finished rows leave. So a
request that arrives while others are decoding joins them at the next step instead of waiting for the batch to
drain. Only streamed rows, rows with stop strings and finished rows do any per-row text work, and a step's
deltas reach the event loop in one call (`toolbox.serving.sequence.publish`). Weight loads and digests take the
same lock as a step, so they happen between steps; rows still running keep the KV entries computed with the old
weights.

Not covered: paged attention, prefix caching, chunked prefill, preemption. Memory grows with the longest
running row times ``max_batch_size``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from toolbox.serving.kv import RunningKV, running_kv
from toolbox.serving.sampling import RowSampling, Sampled, sample_rows
from toolbox.serving.sequence import Delta, Sequence, publish

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
                with self.lock, torch.inference_mode():
                    self._step([s for s in newcomers if not s.cancelled])
        except BaseException as err:  # the thread must not die silently: requests would hang
            log.exception("toolbox serve: the scheduler thread failed")
            self._failure = err
            publish([(seq, err) for seq in [*self._running, *self._waiting]])

    def _step(self, newcomers: list[Sequence]) -> None:
        raise NotImplementedError


class ContinuousBatcher(BatchLoop):
    """Owns the model while serving: admits sequences, runs prefill and decode steps, loads weights between steps."""

    def __init__(self, model: nn.Module, pad_id: int, max_batch_size: int = 32, max_queue: int = 256) -> None:
        super().__init__(max_batch_size, max_queue, "toolbox-serve-scheduler")
        self.model = model
        self.device = next(model.parameters()).device
        self.kv: RunningKV = running_kv(model, max_batch_size, pad_id)
        self._rows: RowSampling | None = None  # the running rows' settings; rebuilt when rows join or leave
        # Per row: EOS id (-1: none, or ignored), max_tokens, tokens so far; rebuilt when rows join or leave.
        self._limits_B = torch.zeros((3, 0), dtype=torch.long)
        self.peak_running = 0  # the most rows ever decoded together (tests read it)

    def _step(self, newcomers: list[Sequence]) -> None:
        """Decode the running rows, prefill the newcomers, sample every row, then drop the finished rows."""
        logits = []
        if self._running:
            last = torch.tensor([s.last_token for s in self._running], dtype=torch.long, device=self.device)
            logits.append(self.kv.step(last))
        if newcomers:
            logits.append(self.kv.join([s.prompt_ids for s in newcomers]))
            self._running = self._running + newcomers
            self._settings_changed()
            self.peak_running = max(self.peak_running, len(self._running))
        self.steps += 1
        if not logits:
            return
        assert self._rows is not None
        sampled = sample_rows(torch.cat(logits) if len(logits) > 1 else logits[0], self._rows)
        events = self._record(sampled)
        if events:
            publish(events)
        if any(s.done for s in self._running):
            self._leave()

    def _record(self, sampled: Sampled) -> list[tuple[Sequence, Delta | BaseException]]:
        """Add each row's token; the deltas of rows that finished or are watched (streamed, or with stop strings)."""
        tokens, logprobs = sampled.token_B.tolist(), sampled.logprob_B.tolist()
        eos_B, max_B, count_B = self._limits_B
        count_B += 1
        at_eos = (sampled.token_B.cpu() == eos_B).tolist()
        at_length = (count_B >= max_B).tolist()
        tops = self._tops(sampled)
        events: list[tuple[Sequence, Delta | BaseException]] = []
        for i, seq in enumerate(self._running):
            seq.record(tokens[i], logprobs[i], tops[i] if tops else None)
            ended = "stop" if at_eos[i] else "length" if at_length[i] else None
            if ended or seq.watched:
                delta = seq.advance(ended)
                if delta is not None:
                    events.append((seq, delta))
        return events

    def _tops(self, sampled: Sampled) -> list[list[tuple[int, float]]]:
        """Each row's top (id, log-prob) pairs, cut to what the row asked for (empty when no row asked)."""
        if not sampled.top_ids_BK.shape[1]:
            return []
        ids, logps = sampled.top_ids_BK.tolist(), sampled.top_logprobs_BK.tolist()
        return [list(zip(i[: s.params.num_top], lp[: s.params.num_top], strict=True))
                for s, i, lp in zip(self._running, ids, logps, strict=True)]

    def _leave(self) -> None:
        """Drop finished (or cancelled) rows: rows from the end of the batch fill their places."""
        done = [s.done for s in self._running]
        keep = [i for i, d in enumerate(done) if not d]
        order = list(range(len(keep)))
        holes = [j for j in order if done[j]]
        for hole, tail in zip(holes, [i for i in keep if i >= len(keep)], strict=True):
            order[hole] = tail
        self.kv.keep(order)
        self._running = [self._running[i] for i in order]
        self._settings_changed()

    def _settings_changed(self) -> None:
        rows = self._running
        p = [s.params for s in rows]
        self._rows = RowSampling.of([(x.temperature, x.top_k, x.top_p) for x in p], max((x.num_top for x in p),
                                    default=0), [s.generator for s in rows], self.device)
        eos = [-1 if x.ignore_eos or s.eos_id is None else s.eos_id for x, s in zip(p, rows, strict=True)]
        self._limits_B = torch.tensor([eos, [x.max_tokens for x in p], [len(s.token_ids) for s in rows]],
                                      dtype=torch.long).reshape(3, len(rows))
