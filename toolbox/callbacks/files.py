"""Callbacks that write results into the run directory: JSONL metrics, TensorBoard, the reward curve."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolbox.callbacks import CALLBACKS
from toolbox.core.events import Event, EventBus
from toolbox.core.extras import needs_extra
from toolbox.tracing.entries import SAMPLE_COLUMNS, StepSamples


class JsonlConfig(BaseModel):
    """Options of the JSONL metrics callback."""

    model_config = ConfigDict(extra="forbid")
    filename: str = Field("metrics.jsonl", description="File in the run directory; one JSON object per event.")
    samples_filename: str = Field("samples.jsonl", description="File in the run directory for recorded samples "
                                  "(trainer.log_samples_every): one trace entry per line, read by `toolbox traces`.")


@CALLBACKS.register("jsonl", config=JsonlConfig)
class JsonlMetrics:
    """Appends one JSON line per step / eval / checkpoint to ``<run_dir>/metrics.jsonl``, and each recorded
    sample (a `toolbox.tracing.SampleTrace`) to ``<run_dir>/samples.jsonl``."""

    def __init__(self, config: JsonlConfig, run_dir: Path) -> None:
        self.path, self.samples_path = run_dir / config.filename, run_dir / config.samples_filename

    def attach(self, bus: EventBus) -> None:
        for event in (Event.STEP_END, Event.EVAL_END, Event.CHECKPOINT_SAVED):
            bus.subscribe(event, self._write)
        bus.subscribe(Event.SAMPLES, self._samples)

    def _samples(self, _: Event, payload: dict[str, Any]) -> None:
        recorded: StepSamples = payload["samples"]
        with self.samples_path.open("a") as f:
            f.writelines(s.model_dump_json() + "\n" for s in recorded.samples)

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
    """Scalars per step (train/*) and evaluation (eval/*); at recorded steps, the samples as a text table and
    histograms of the step's rewards and advantages. A no-op with a warning naming the extra if tensorboard is
    absent (it is one of the default callbacks, so a run without the package still runs)."""

    def __init__(self, config: TensorBoardConfig, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # optional dependency: the run still works, say so once
            import logging

            logging.getLogger(__name__).warning("%s; no TensorBoard logging in this run", needs_extra(
                "the tensorboard callback", "tensorboard", "tensorboard is not installed"))
            self.writer = None
            return
        self.writer = SummaryWriter(str(run_dir / config.subdir))

    def attach(self, bus: EventBus) -> None:
        if self.writer is None:
            return
        writer = self.writer
        bus.subscribe(Event.STEP_END, lambda e, p: self._scalars("train", p))
        bus.subscribe(Event.EVAL_END, lambda e, p: self._scalars("eval", p))
        bus.subscribe(Event.SAMPLES, self._samples)
        bus.subscribe(Event.FIT_END, lambda e, p: writer.close())

    def _samples(self, _: Event, payload: dict[str, Any]) -> None:
        if self.writer is None:
            return
        recorded: StepSamples = payload["samples"]
        self.writer.add_text("samples", samples_markdown(recorded), payload["step"])
        for name, h in recorded.histograms.items():
            self.writer.add_histogram_raw(f"train/{name}_hist", h.min, h.max, h.num, h.sum, h.sum_squares, h.edges[1:],
                                          h.counts, payload["step"])

    def _scalars(self, prefix: str, payload: dict[str, Any]) -> None:
        if self.writer is None:
            return
        for key, value in payload["metrics"].items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"{prefix}/{key}", value, payload["step"])


def samples_markdown(recorded: StepSamples) -> str:
    """The recorded samples as a Markdown table (TensorBoard renders text summaries as Markdown)."""
    def cell(value: Any) -> str:
        text = "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", "⏎ ")

    header = "| " + " | ".join(SAMPLE_COLUMNS) + " |\n|" + "---|" * len(SAMPLE_COLUMNS)
    return "\n".join([header, *("| " + " | ".join(cell(v) for v in s.row().values()) + " |" for s in recorded.samples)])


class CurveConfig(BaseModel):
    """Options of the curve-plot callback."""

    model_config = ConfigDict(extra="forbid")
    metrics: list[str] = Field(default_factory=lambda: ["reward", "kl", "response_len"],
                               description="Metrics plotted, one panel each, besides the dashboard's own (reward or "
                               "return, loss, KL, response length, step time; see `toolbox plot`).")
    filename: str = Field("curves.png", description="PNG file in the run directory.")


_PENDING: list[Callable[[], Any]] = []  # dashboards waiting for `start_plots` (`CurvePlot.background`)
_DRAWING: list[threading.Thread] = []  # dashboards being drawn in the background


def start_plots() -> None:
    """Start drawing, each in a thread, the dashboards the run left for the background."""
    while _PENDING:
        drawing = threading.Thread(target=_PENDING.pop(0), name="curves-png")
        drawing.start()
        _DRAWING.append(drawing)


def wait_for_plots() -> None:
    """Return once every dashboard left for the background is written (started here if it was not yet)."""
    start_plots()
    while _DRAWING:
        _DRAWING.pop().join()


@CALLBACKS.register("curves", config=CurveConfig)
class CurvePlot:
    """At the end of a run, draws the run's dashboard (`toolbox.callbacks.plots`) into a PNG (matplotlib, headless).

    ``background`` (set by `toolbox.run`): leave the drawing for `start_plots`, which the entry point calls once the
    run's actors are gone, so matplotlib's ~90 MiB never adds to theirs at the run's peak, and the second of
    matplotlib work overlaps Ray's shutdown instead of preceding it; `wait_for_plots` waits for it."""

    background = False

    def __init__(self, config: CurveConfig, run_dir: Path) -> None:
        from toolbox.callbacks.plots import RunSeries

        self.config, self.path = config, run_dir / config.filename
        self.series = RunSeries(run_dir.name)

    def attach(self, bus: EventBus) -> None:
        bus.subscribe(Event.STEP_END, self._record)
        bus.subscribe(Event.FIT_END, self._plot)

    def _record(self, _: Event, payload: dict[str, Any]) -> None:
        self.series.add(payload["step"], payload["metrics"])

    def _plot(self, _: Event, payload: dict[str, Any]) -> None:
        from toolbox.callbacks.plots import dashboard

        # A metric this algorithm never reports (no KL without a reference) gets no empty panel.
        draw = functools.partial(dashboard, [self.series], self.path,
                                 title=str(payload.get("summary", {}).get("experiment", "")), extra=self.config.metrics)
        if not CurvePlot.background:
            draw()
            return
        _PENDING.append(draw)
