"""One choice being generated: its sampling settings, its tokens so far, its stop rules and its listener.

A batcher records each sampled token (`Sequence.record`) and, when the token ended the choice (EOS or
``max_tokens``, decided on tensors for the whole batch) or the choice is watched (streamed, or it has stop
strings), calls `Sequence.advance`, which applies stop strings and returns the `Delta` to hand to the listener.
A choice that is neither streamed nor finished costs no text work: its text is decoded once, at the end, and a
stop string is looked for only after a token that could complete one. Text that could still turn out to be the
start of a stop string is held back until it cannot, so a streamed text never shows a stop string.

Listeners live on an asyncio loop; `publish` hands a step's deltas to each loop in one thread-safe call.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from toolbox.serving.sampling import Choice


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, already validated by the protocol layer."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    num_top: int = 0
    ignore_eos: bool = False
    top_k: int = 0


@dataclass(frozen=True)
class Delta:
    """What one step added to a sequence; ``finish`` is "stop" or "length" on its last delta, else None."""

    text: str
    choice: Choice
    finish: str | None


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` might be the beginning of a stop string."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


@dataclass
class Sequence:
    """A prompt and the tokens sampled after it, for one choice of one request.

    ``listener`` is called on ``loop`` (the request's event loop; None: on the batcher's thread, as tests do);
    ``token_text`` is one token's text on its own, for the cheap test of whether a stop string could end here.
    """

    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    listener: Callable[[Delta | BaseException], Any]
    decode: Callable[[list[int]], str]
    eos_id: int | None
    stream: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    token_text: Callable[[int], str] = str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    shown: int = 0
    finish: str | None = None
    cancelled: bool = False

    def record(self, token: int, logprob: float, top: list[tuple[int, float]] | None = None) -> None:
        """Add one sampled token (no text work: `advance` does that when it is needed)."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if self.params.num_top:
            self.tops.append(top or [])

    @property
    def watched(self) -> bool:
        """Whether every token needs `advance`: a streamed choice, or one with stop strings."""
        return self.stream or bool(self.params.stop)

    def ended_by(self, token: int) -> str | None:
        """The finish this token means by itself: "stop" at EOS (unless ignored), "length" at ``max_tokens``."""
        if token == self.eos_id and not self.params.ignore_eos:
            return "stop"
        return "length" if len(self.token_ids) >= self.params.max_tokens else None

    def advance(self, ended: str | None) -> Delta | None:
        """Apply stop strings after the last `record`, then finish with ``ended`` ("stop" / "length") if it is set;
        the `Delta` to hand to the listener, or None when there is nothing to tell (a non-streamed choice that
        goes on)."""
        if self._could_stop():
            full = self.decode(self.token_ids)
            cut = min((i for i in (full.find(s) for s in self.params.stop) if i >= 0), default=-1)
            if cut >= 0:
                self.text, self.finish = full[:cut], "stop"
            elif self.stream or ended:
                self.text = full
        elif self.stream or ended:
            self.text = self.decode(self.token_ids)
        if self.finish is None:
            self.finish = ended
        if not (self.stream or self.finish):
            return None
        visible = len(self.text) if self.finish else len(self.text) - _held_back(self.text, self.params.stop)
        delta = Delta(self.text[self.shown : max(visible, self.shown)], self.last_choice(), self.finish)
        self.shown = max(visible, self.shown)
        return delta

    def append(self, choice: Choice, ended: str | None = None) -> Delta:
        """Record ``choice`` and tell the listener at once (one token at a time: the engine backend's replay).

        ``ended`` is a finish a generation engine already decided at this token (its own stop tokens); stop
        strings still take precedence, since they also cut the text.
        """
        self.record(choice.token, choice.logprob, choice.top)
        own = self.ended_by(choice.token)
        delta = self.advance("stop" if "stop" in (own, ended) else own or ended)
        if delta is None:
            delta = Delta("", choice, None)
        publish([(self, delta)])
        return delta

    def _could_stop(self) -> bool:
        """Whether the last token could have completed a stop string: its text holds a stop string's last
        character, or it has no text of its own (part of a multi-byte character, or a whitespace marker)."""
        if not self.params.stop:
            return False
        piece = self.token_text(self.token_ids[-1])
        return not piece.strip() or "\ufffd" in piece or any(s[-1] in piece or s[-1].isspace()
                                                            for s in self.params.stop)

    def choices(self) -> list[Choice]:
        """Every token as a `Choice` (for the log-probs of a response)."""
        tops = self.tops if self.params.num_top else [[] for _ in self.token_ids]
        return [Choice(t, lp, top) for t, lp, top in zip(self.token_ids, self.logprobs, tops, strict=True)]

    def last_choice(self) -> Choice:
        return Choice(self.token_ids[-1], self.logprobs[-1], self.tops[-1] if self.params.num_top else [])

    @property
    def done(self) -> bool:
        return self.finish is not None or self.cancelled

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]


def publish(events: list[tuple[Sequence, Delta | BaseException]]) -> None:
    """Hand each event to its sequence's listener: one thread-safe call per event loop for the whole list."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Sequence, Delta | BaseException]]] = defaultdict(list)
    for seq, event in events:
        if seq.loop is None:
            seq.listener(event)
        else:
            by_loop[seq.loop].append((seq, event))
    for loop, batch in by_loop.items():
        loop.call_soon_threadsafe(_deliver, batch)


def _deliver(batch: list[tuple[Sequence, Delta | BaseException]]) -> None:
    for seq, event in batch:
        seq.listener(event)
