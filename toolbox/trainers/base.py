"""`BaseTrainer`: the fixed skeleton every algorithm's driver loop runs (Template Method).

``fit()`` = prepare -> for each step: train_step, maybe_evaluate, maybe_save (until should_stop) -> finish.
Subclasses write ``train_step`` (and optionally ``evaluate``/``save``/``prepare``).
The loop never prints or writes files itself: it emits events, and callbacks do.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any

from toolbox.config.schema import TrainerConfig
from toolbox.core.events import Event, EventBus


class BaseTrainer(ABC):
    """Drives one experiment. Holds worker groups and small metric dicts, never bulk tensors."""

    def __init__(self, cfg: TrainerConfig, bus: EventBus, experiment: str = "") -> None:
        self.cfg, self.bus, self.experiment = cfg, bus, experiment
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.last_checkpoint = ""

    # ---- the skeleton -------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        start = time.perf_counter()
        self.step = self.prepare()
        self.bus.emit(Event.FIT_START, {"start_step": self.step, "total_steps": self.cfg.total_steps})
        while self.step < self.cfg.total_steps:
            t0 = time.perf_counter()
            metrics = self.train_step(self.step)
            self.step += 1
            metrics["step_time_s"] = time.perf_counter() - t0
            self.history.append(metrics)
            self.bus.emit(Event.STEP_END, {"step": self.step, "metrics": metrics})
            self.maybe_evaluate()
            stop = self.should_stop()
            self.maybe_save(final=stop)
            if stop:
                break
        summary = self.summarize(time.perf_counter() - start)
        self.finish()
        self.bus.emit(Event.FIT_END, {"step": self.step, "summary": summary})
        return summary

    def maybe_evaluate(self) -> None:
        every = self.cfg.eval_every
        if every and (self.step % every == 0 or self.step == self.cfg.total_steps):
            self.bus.emit(Event.EVAL_END, {"step": self.step, "metrics": self.evaluate()})

    def maybe_save(self, final: bool = False) -> None:
        every = self.cfg.save_every
        if final or self.step == self.cfg.total_steps or (every and self.step % every == 0):
            self.last_checkpoint = self.save(self.step)
            self.bus.emit(Event.CHECKPOINT_SAVED, {"step": self.step, "path": self.last_checkpoint})

    def summarize(self, wall_s: float) -> dict[str, Any]:
        """Reward over the first and last 10% of this run's steps, and wall time."""
        rewards = [m["reward"] for m in self.history if "reward" in m]
        k = max(1, len(rewards) // 10)
        summary: dict[str, Any] = {"experiment": self.experiment, "steps": self.step}
        if rewards:
            summary["reward_first_10pct"] = sum(rewards[:k]) / k
            summary["reward_last_10pct"] = sum(rewards[-k:]) / k
        summary["train_wall_time_s"] = round(wall_s, 1)
        summary["last_checkpoint"] = self.last_checkpoint
        return summary

    # ---- what algorithms provide --------------------------------------------------------------
    def prepare(self) -> int:
        """Start-up work (initial weight sync, resume); returns the step to start from."""
        return 0

    @abstractmethod
    def train_step(self, step: int) -> dict[str, float]:
        """One step of the algorithm; returns its metrics."""

    def evaluate(self) -> dict[str, float]:
        return {}

    def should_stop(self) -> bool:
        """Checked after each step's evaluation: ``True`` ends the run early (with a final checkpoint)."""
        return False

    @abstractmethod
    def save(self, step: int) -> str:
        """Checkpoint; returns where it went."""

    def finish(self) -> None:
        return None
