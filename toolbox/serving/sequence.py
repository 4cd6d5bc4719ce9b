"""One choice being generated: its sampling settings, its tokens so far, its stop rules and its listener.

The scheduler thread appends tokens; each append yields a `Delta` (the newly visible text, the token, its
log-probs, and the finish reason once finished) that is handed to ``listener``. Text that could still turn out
to be the start of a stop string is held back until it cannot, so a streamed text never shows a stop string.
"""

from __future__ import annotations

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
    """A prompt and the tokens sampled after it, for one choice of one request."""

    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    listener: Callable[[Delta | BaseException], Any]
    decode: Callable[[list[int]], str]
    eos_id: int | None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    shown: int = 0
    finish: str | None = None
    cancelled: bool = False

    def append(self, choice: Choice, ended: str | None = None) -> Delta:
        """Record ``choice``, apply EOS / stop strings / ``max_tokens``, and tell the listener what changed.

        ``ended`` ("stop" / "length") is a finish a generation engine already decided at this token (its own
        stop tokens); stop strings still take precedence, since they also cut the text.
        """
        self.token_ids.append(choice.token)
        full = self.decode(self.token_ids)
        cut = min((i for i in (full.find(s) for s in self.params.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.finish = full[:cut], "stop"
        elif (choice.token == self.eos_id and not self.params.ignore_eos) or ended == "stop":
            self.text, self.finish = full, "stop"
        elif len(self.token_ids) >= self.params.max_tokens or ended == "length":
            self.text, self.finish = full, "length"
        else:
            self.text = full
        visible = len(self.text) if self.finish else len(self.text) - _held_back(self.text, self.params.stop)
        delta = Delta(self.text[self.shown : max(visible, self.shown)], choice, self.finish)
        self.shown = max(visible, self.shown)
        self.listener(delta)
        return delta

    @property
    def done(self) -> bool:
        return self.finish is not None or self.cancelled

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]
