"""Live console progress (rich) and the end-of-run summary table."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from toolbox.callbacks import CALLBACKS
from toolbox.core.events import Event, EventBus

SHOWN = (("reward", "reward"), ("env_steps", "env steps"), ("episode_return", "return"), ("loss", "loss"),
         ("policy_loss", "pi loss"), ("value_loss", "vf loss"), ("kl", "kl"), ("response_len", "len"),
         ("env_steps_per_s", "steps/s"), ("learner_tokens_per_s", "tok/s"), ("mfu", "mfu"), ("step_time_s", "s/step"))


class ConsoleConfig(BaseModel):
    """Options of the console callback."""

    model_config = ConfigDict(extra="forbid")
    refresh_per_second: float = Field(4.0, gt=0, description="Progress bar refresh rate.")


def stderr_console() -> Console:
    """A rich console on stderr. Logs (ray job logs, CI) are not terminals: rich would wrap them at 80 columns."""
    return Console(stderr=True, width=None if sys.stderr.isatty() else 150)


def tool_main(argv: list[str] | None, parse: Callable[[list[str]], Any], body: Callable[[Any], str], label: str,
              errors: tuple[type[BaseException], ...]) -> int:
    """A small command's ``main``: parse ``argv`` (argparse), run ``body(args)`` and print the line it returns.

    Exit codes: 0 done, 2 a usage error (argparse has printed it) or one of ``errors`` (printed as ``<label> error``).
    """
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:  # --help, or a usage error argparse has printed
        return stop.code if isinstance(stop.code, int) else 2
    console = stderr_console()
    try:
        done = body(args)
    except errors as err:
        console.print(f"[bold red]{label} error[/]: {escape(str(err))}")
        return 2
    console.print(done)
    return 0


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3g}"
    return str(value)


@CALLBACKS.register("console", config=ConsoleConfig)
class ConsoleProgress:
    """A progress bar with step, reward, loss, KL, response length and step time; a summary at the end."""

    def __init__(self, config: ConsoleConfig, total_steps: int, console: Console | None = None) -> None:
        self.console = console or stderr_console()
        self.progress = Progress(
            TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(bar_width=16), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[stats]}"), console=self.console,
            refresh_per_second=config.refresh_per_second, expand=False,
        )
        self.task = self.progress.add_task("train", total=total_steps, stats="starting workers...")

    def attach(self, bus: EventBus) -> None:
        bus.subscribe(Event.FIT_START, self._start)
        bus.subscribe(Event.STEP_END, self._step)
        bus.subscribe(Event.EVAL_END, self._eval)
        bus.subscribe(Event.CHECKPOINT_SAVED, self._saved)
        bus.subscribe(Event.FIT_END, self._end)

    def _start(self, _: Event, payload: dict[str, Any]) -> None:
        self.progress.start()
        self.progress.update(self.task, completed=payload.get("start_step", 0), stats="")

    def _step(self, _: Event, payload: dict[str, Any]) -> None:
        m = payload["metrics"]
        stats = "  ".join(f"{label} {_fmt(m[key])}" for key, label in SHOWN if key in m)
        if m.get("reward_error"):
            stats += f"  [red]reward errors {int(m['reward_error'])}[/]"
        self.progress.update(self.task, completed=payload["step"], stats=stats)

    def _eval(self, _: Event, payload: dict[str, Any]) -> None:
        self.progress.console.log(f"eval @ step {payload['step']}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in payload["metrics"].items()))

    def _saved(self, _: Event, payload: dict[str, Any]) -> None:
        self.progress.console.log(f"checkpoint saved: {payload['path']}")

    def _end(self, _: Event, payload: dict[str, Any]) -> None:
        self.progress.stop()
        summary = payload.get("summary", {})
        table = Table(title="run summary", show_header=False)
        for key, value in summary.items():
            table.add_row(key, _fmt(value))
        self.console.print(table)
