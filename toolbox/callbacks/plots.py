"""One dashboard PNG of runs, drawn for ``toolbox plot RUN_DIR [RUN_DIR ...] [-o OUT.png]`` (`toolbox.commands.plot`).

The panels: reward (the episode return of classic-RL runs), loss, KL, response length, and the step-time
breakdown (generation / reward / learning / weight sync / waiting: the mean seconds of a step, one bar per run).
Several runs are overlaid, each in its own colour, with a legend. Everything is read from the per-step
records a run already writes (``RUN_DIR/metrics.jsonl``, the ``jsonl`` callback); a panel no run has a metric
for is left out, and a run that lacks a panel's metric is named in that panel.

This module is the project's one plotting helper: the ``curves`` callback draws a run's ``curves.png`` with
`dashboard` at the end of the run, and ``toolbox tune`` draws its trials' dashboard with `plot_runs`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Each panel: the candidate metric keys, the first a run reports is plotted (ppo_env reports episode_return,
# not reward); the panel's title names what was plotted.
PANELS: tuple[tuple[str, ...], ...] = (
    ("reward", "episode_return"),
    ("loss",),
    ("kl", "approx_kl"),
    ("response_len", "episode_len"),
)
TITLES = {"reward": "reward", "episode_return": "return (training episodes)", "kl": "KL to the reference",
          "approx_kl": "approx. KL (old -> new policy)", "response_len": "response length (tokens)",
          "episode_len": "episode length (env steps)"}
# The step-time breakdown: part -> candidate keys (seconds per step). Waiting is the rest of `step_time_s`.
TIME_PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("generation", ("generate_s", "rollout_s")),
    ("reward", ("reward_s",)),
    ("learning", ("train_s",)),
    ("sync", ("sync_s",)),
)
STEP_TIME = "step_time_s"
# Config leaves that differ between any two runs without saying anything about them.
_NOISE = ("trainer.run_name", "trainer.run_root", "trainer.resume_from")


@dataclass
class RunSeries:
    """One run's per-step metrics: ``metrics[key][i]`` is the value at ``steps[i]`` (NaN where absent)."""

    label: str
    steps: list[int] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def add(self, step: int, values: dict[str, Any]) -> None:
        """Append one step's numeric metrics (a key first seen now is NaN-padded for earlier steps)."""
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.metrics.setdefault(key, [math.nan] * len(self.steps))
        self.steps.append(step)
        for key, column in self.metrics.items():
            value = values.get(key)
            column.append(float(value) if isinstance(value, (int, float)) else math.nan)

    def has(self, key: str) -> bool:
        return any(v == v for v in self.metrics.get(key, ()))

    def first(self, keys: Sequence[str]) -> str | None:
        """The first of ``keys`` this run reports, if any."""
        return next((k for k in keys if self.has(k)), None)

    def mean(self, key: str) -> float:
        values = [v for v in self.metrics.get(key, ()) if v == v]
        return sum(values) / len(values) if values else 0.0


def read_run(run_dir: Path, label: str = "") -> RunSeries:
    """The ``step_end`` records of ``RUN_DIR/metrics.jsonl``; a missing file or a bad line is a `ValueError`."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{path}: no such file (is {run_dir} a run directory written with the jsonl callback?)")
    series = RunSeries(label or Path(run_dir).name)
    for row, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{row}: not a JSON object ({err.msg})") from None
        if record.get("event") == "step_end" and isinstance(record.get("metrics"), dict):
            series.add(int(record["step"]), record["metrics"])
    return series


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """A legend label per run: its directory name, plus the config values that differ between the runs."""
    names = [Path(d).name for d in run_dirs]
    configs = [_flat(_load_yaml(Path(d) / "config.yaml")) for d in run_dirs]
    if len(run_dirs) < 2 or not all(configs):
        return names
    keys = sorted({k for c in configs for k in c if not k.startswith(_NOISE)})
    differ = [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1
              and all(isinstance(c.get(k), (str, int, float, bool, type(None))) for c in configs)]
    return [f"{name} ({', '.join(_short(k, c) for k in differ[:3])})" if differ else name
            for name, c in zip(names, configs)]


def _short(key: str, config: dict[str, Any]) -> str:
    return f"{key.rsplit('.', 1)[-1]}={config.get(key)}"


def _load_yaml(path: Path) -> dict[str, Any]:
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    return {k: v for key, value in tree.items() for k, v in _flat(value, f"{prefix}{key}.").items()}


def dashboard(runs: Sequence[RunSeries], path: Path, title: str = "", extra: Sequence[str] = ()) -> Path | None:
    """Draw the dashboard of ``runs`` into ``path`` (PNG); ``extra`` adds a panel per further metric key.

    Returns ``path``, or None when no run has any step to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = dashboard_figure(runs, title, extra)
    if fig is None:
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def dashboard_figure(runs: Sequence[RunSeries], title: str = "", extra: Sequence[str] = ()) -> Any:
    """The dashboard as a matplotlib ``Figure`` (None when there is nothing to plot); `dashboard` saves it."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    panels = [*PANELS, *((key,) for key in extra if all(key not in keys for keys in PANELS))]
    shown = [keys for keys in panels if any(run.first(keys) for run in runs)]
    timed = [(i, run) for i, run in enumerate(runs, 1) if run.has(STEP_TIME)]
    count = len(shown) + bool(timed)
    if not count:
        return None
    cols = min(3, count)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    flat_axes = list(axes.flat)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for ax, keys in zip(flat_axes, shown):
        _curve_panel(ax, keys, runs, colors)
    if timed:
        _time_panel(flat_axes[len(shown)], timed)
    for ax in flat_axes[count:]:
        ax.set_visible(False)
    # One legend for every curve panel: a run's colour (solid: moving average over a tenth of its steps; faint: raw).
    handles = [Line2D([], [], color=color, label=f"{i}: {run.label}") for i, (run, color) in enumerate(zip(runs, colors), 1)]
    fig.legend(handles=handles, loc="lower center", fontsize=8, frameon=False,
               title="runs (faint: per step, solid: moving average)", title_fontsize=8)
    fig.suptitle(title)
    legend_in = 0.25 + 0.19 * len(runs)  # the legend's height in inches, below the panels
    fig.set_figheight(fig.get_figheight() + legend_in)
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))
    return fig


def line_chart(series: dict[str, Sequence[tuple[float, float]]], path: Path, xlabel: str, ylabel: str,
               title: str = "") -> Path:
    """One panel of named (x, y) series, a line with markers each (a few measured points, such as held-out
    accuracy against training time), saved as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, points in series.items():
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _curve_panel(ax: Any, keys: Sequence[str], runs: Sequence[RunSeries], colors: list[str]) -> None:
    """Each run's metric against step: the raw values faint, a moving average (a tenth of the run) solid."""
    import numpy as np

    missing: list[str] = []
    used: set[str] = set()
    for run, color in zip(runs, colors):
        key = run.first(keys)
        if key is None:
            missing.append(run.label)
            continue
        used.add(key)
        y = np.asarray(run.metrics[key], dtype=float)
        window = max(1, len(y) // 10)
        # Markers on short runs: a run Tune stopped after one step is a point, and a line of one point is invisible.
        ax.plot(run.steps, y, color=color, alpha=0.3 if window > 1 else 1.0, marker="o" if len(y) <= 20 else None,
                markersize=3)
        if window > 1:
            smooth = np.convolve(np.nan_to_num(y), np.ones(window) / window, mode="valid")
            ax.plot(run.steps[window - 1:], smooth, color=color)
    ax.set_title(" / ".join(TITLES.get(k, k) for k in keys if k in used), fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if missing:
        ax.text(0.01, 0.01, "no data: " + ", ".join(missing), transform=ax.transAxes, fontsize=7, color="gray")


def step_time_breakdown(run: RunSeries) -> dict[str, float]:
    """Mean seconds per step of each part; ``waiting`` is what the parts leave of ``step_time_s`` (never < 0)."""
    parts = {}
    for part, keys in TIME_PARTS:
        key = run.first(keys)
        parts[part] = run.mean(key) if key else 0.0
    parts["waiting"] = max(0.0, run.mean(STEP_TIME) - sum(parts.values()))
    return parts


def _time_panel(ax: Any, numbered: Sequence[tuple[int, RunSeries]]) -> None:
    """One horizontal bar per run (by its number in the legend), stacked by part of the step."""
    left = [0.0] * len(numbered)
    breakdowns = [step_time_breakdown(run) for _, run in numbered]
    for i, part in enumerate([*(p for p, _ in TIME_PARTS), "waiting"]):
        widths = [b[part] for b in breakdowns]
        ax.barh(range(len(numbered)), widths, left=left, color=f"C{i}", label=part)
        left = [a + w for a, w in zip(left, widths)]
    ax.set_yticks(range(len(numbered)), [str(i) for i, _ in numbered], fontsize=8)
    ax.set_ylabel("run")
    ax.set_xlabel("mean seconds per step")
    ax.set_title("step time", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7)


def plot_runs(run_dirs: Sequence[Path], out: Path, title: str = "", extra: Sequence[str] = ()) -> Path | None:
    """Read each run directory and draw their dashboard into ``out`` (``extra``: a panel per further metric)."""
    dirs = [Path(d) for d in run_dirs]
    runs = [read_run(d, label) for d, label in zip(dirs, run_labels(dirs))]
    return dashboard(runs, out, title=title, extra=extra)
