"""Callbacks that write results into the run directory: JSONL metrics, TensorBoard, the reward curve."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolbox.callbacks import CALLBACKS
from toolbox.core.events import Event, EventBus


class JsonlConfig(BaseModel):
    """Options of the JSONL metrics callback."""

    model_config = ConfigDict(extra="forbid")
    filename: str = Field("metrics.jsonl", description="File in the run directory; one JSON object per event.")


@CALLBACKS.register("jsonl", config=JsonlConfig)
class JsonlMetrics:
    """Appends one JSON line per step / eval / checkpoint to ``<run_dir>/metrics.jsonl``."""

    def __init__(self, config: JsonlConfig, run_dir: Path) -> None:
        self.path = run_dir / config.filename

    def attach(self, bus: EventBus) -> None:
        for event in (Event.STEP_END, Event.EVAL_END, Event.CHECKPOINT_SAVED):
            bus.subscribe(event, self._write)

    def _write(self, event: Event, payload: dict[str, Any]) -> None:
        record = {"event": event.value, "time": time.time(), **payload}
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")


class TensorBoardConfig(BaseModel):
    """Options of the TensorBoard callback."""

    model_config = ConfigDict(extra="forbid")
    subdir: str = Field("tensorboard", description="Event-file directory inside the run directory.")


@CALLBACKS.register("tensorboard", config=TensorBoardConfig)
class TensorBoardMetrics:
    """Scalars per step (train/*) and evaluation (eval/*). A no-op with a warning if tensorboard is absent."""

    def __init__(self, config: TensorBoardConfig, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # optional dependency: the run still works, say so once
            import logging

            logging.getLogger(__name__).warning("tensorboard is not installed; skipping TensorBoard logging")
            self.writer = None
            return
        self.writer = SummaryWriter(str(run_dir / config.subdir))

    def attach(self, bus: EventBus) -> None:
        if self.writer is None:
            return
        writer = self.writer
        bus.subscribe(Event.STEP_END, lambda e, p: self._scalars("train", p))
        bus.subscribe(Event.EVAL_END, lambda e, p: self._scalars("eval", p))
        bus.subscribe(Event.FIT_END, lambda e, p: writer.close())

    def _scalars(self, prefix: str, payload: dict[str, Any]) -> None:
        if self.writer is None:
            return
        for key, value in payload["metrics"].items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"{prefix}/{key}", value, payload["step"])


class CurveConfig(BaseModel):
    """Options of the curve-plot callback."""

    model_config = ConfigDict(extra="forbid")
    metrics: list[str] = Field(default_factory=lambda: ["reward", "kl", "response_len"], description="Metrics plotted, one panel each.")
    filename: str = Field("curves.png", description="PNG file in the run directory.")


@CALLBACKS.register("curves", config=CurveConfig)
class CurvePlot:
    """At the end of a run, plots the chosen metrics against step into a PNG (matplotlib, headless)."""

    def __init__(self, config: CurveConfig, run_dir: Path) -> None:
        self.config, self.path = config, run_dir / config.filename
        self.steps: list[int] = []
        self.values: dict[str, list[float]] = {m: [] for m in config.metrics}

    def attach(self, bus: EventBus) -> None:
        bus.subscribe(Event.STEP_END, self._record)
        bus.subscribe(Event.FIT_END, self._plot)

    def _record(self, _: Event, payload: dict[str, Any]) -> None:
        self.steps.append(payload["step"])
        for name in self.config.metrics:
            self.values[name].append(float(payload["metrics"].get(name, float("nan"))))

    def _plot(self, _: Event, payload: dict[str, Any]) -> None:
        # A metric this algorithm never reports (no KL without a reference) gets no empty panel.
        shown = {k: v for k, v in self.values.items() if any(x == x for x in v)}
        if not self.steps or not shown:
            return
        plot_curves(self.steps, shown, self.path, title=str(payload.get("summary", {}).get("experiment", "")))


def plot_curves(steps: list[int], values: dict[str, list[float]], path: Path, title: str = "") -> Path:
    """One panel per metric: the raw values and a moving average."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(values), figsize=(4.2 * len(values), 3.2), squeeze=False)
    window = max(1, len(steps) // 10)
    for ax, (name, ys) in zip(axes[0], values.items()):
        y = np.asarray(ys, dtype=float)
        ax.plot(steps, y, alpha=0.35, label=name)
        if len(y) >= window > 1:
            smooth = np.convolve(y, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1 :], smooth, label=f"{window}-step mean")
        ax.set_xlabel("step")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
