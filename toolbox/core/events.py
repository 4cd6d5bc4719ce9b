"""Events the trainer loop emits and callbacks subscribe to."""

from __future__ import annotations

import enum
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Event(enum.Enum):
    """Points in ``BaseTrainer.fit`` that callbacks can observe."""

    FIT_START = "fit_start"
    ROLLOUT_END = "rollout_end"
    SAMPLES = "samples"  # a few recorded samples of a step (`toolbox.tracing.StepSamples`), every N steps
    STEP_END = "step_end"
    EVAL_END = "eval_end"
    CHECKPOINT_SAVED = "checkpoint_saved"
    FIT_END = "fit_end"


Handler = Callable[[Event, dict[str, Any]], None]


class EventBus:
    """Synchronous publish/subscribe. A handler that raises stops the run: callbacks are part of it."""

    def __init__(self) -> None:
        self._handlers: dict[Event, list[Handler]] = defaultdict(list)

    def subscribe(self, event: Event, handler: Handler) -> None:
        self._handlers[event].append(handler)

    def emit(self, event: Event, payload: dict[str, Any]) -> None:
        for handler in self._handlers[event]:
            handler(event, payload)
