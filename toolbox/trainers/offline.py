"""`OfflineTrainer`: the driver loop of trainers over a fixed dataset (SFT, offline DPO).

The driver sends each learner rank the step index; ranks build their own slice of
the step's batch from the dataset spec they were built with, and return metrics
already reduced over ranks. Nothing bigger than an integer and a metric dict
crosses to the driver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolbox.config.trainer import TrainerConfig
from toolbox.core.events import EventBus
from toolbox.learner.throughput import step_rates
from toolbox.rl.roles import CheckpointRole, OfflineLearnerRole
from toolbox.trainers.base import BaseTrainer


class OfflineTrainer(BaseTrainer):
    """One optimizer step per ``train_step``; ``summary_metrics`` get first/last-10% means in the summary."""

    def __init__(self, cfg: TrainerConfig, bus: EventBus, learner: OfflineLearnerRole, run_dir: Path, experiment: str = "",
                 summary_metrics: tuple[str, ...] = ("loss",)) -> None:
        super().__init__(cfg, bus, experiment)
        self.learner, self.run_dir = learner, run_dir
        self.summary_metrics = summary_metrics

    def prepare(self) -> int:
        return self.resume(self.learner.load)

    def train_step(self, step: int) -> dict[str, float]:
        """One update; with ``learner_tokens_per_s`` from the step's ``train_tokens`` and ``train_s``."""
        metrics = self.learner.update(step)
        return {**metrics, **step_rates(metrics)}

    def evaluate(self) -> dict[str, float]:
        return self.learner.evaluate()

    def save(self, step: int) -> str:
        return self.save_checkpoint(self.run_dir, step, self.learner.save)

    def profile_target(self) -> tuple[CheckpointRole, Path]:
        return self.learner, self.run_dir

    def finish(self) -> None:
        """With ``trainer.export``: the final policy as a Hugging Face model directory, RUN_DIR/hf (`export_location`)."""
        if self.cfg.export:
            self.learner.export_hf(self.export_location(self.run_dir))

    def summarize(self, wall_s: float) -> dict[str, Any]:
        summary = super().summarize(wall_s)
        for name in self.summary_metrics:
            values = [m[name] for m in self.history if name in m]
            if values:
                k = max(1, len(values) // 10)
                summary[f"{name}_first_10pct"] = sum(values[:k]) / k
                summary[f"{name}_last_10pct"] = sum(values[-k:]) / k
        return summary
