"""Callbacks subscribe to trainer events: progress, metrics files, TensorBoard, summaries."""

from __future__ import annotations

from typing import Protocol

from toolbox.core.events import EventBus
from toolbox.core.registry import Registry


class Callback(Protocol):
    """Something that subscribes to the event bus of one run."""

    def attach(self, bus: EventBus) -> None: ...


CALLBACKS: Registry[Callback] = Registry("callback")

from toolbox.callbacks import console, files, trackers  # noqa: E402,F401  (registers entries)
