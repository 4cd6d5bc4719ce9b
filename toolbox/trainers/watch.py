"""Watching one metric over a run: early stopping with patience, and keeping the best checkpoint by it.

A metric is named as the metrics files name it: ``reward`` is a training-step metric, ``eval/reward`` the same
key of an evaluation's metrics. Patience counts the metric's observations (steps, or evaluations for an
``eval/`` metric) without an improvement of more than ``min_delta``. The best checkpoint is the one saved
when the metric's latest value was the best seen at any save; it lives in ``checkpoints/best`` (hard links to
the files of its ``step_N``, so keeping it costs no space while that ``step_N`` exists, and it survives
``trainer.keep_checkpoints`` pruning; on a remote run_root a copy made on the store), with ``best.json`` saying
which step and value it holds.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from toolbox.config.trainer import WatchConfig
from toolbox.core.errors import ConfigError
from toolbox.core.retry import RetryPolicy
from toolbox.core.storage import COMPLETE, RemoteDir, is_remote

BEST = "best"


class MetricWatch:
    """The latest and best values of one metric (``field`` names the config section, for errors)."""

    def __init__(self, cfg: WatchConfig, field: str) -> None:
        self.cfg, self.field = cfg, field
        self.source, _, self.key = cfg.metric.rpartition("/")
        self.latest: float | None = None
        self.best: float | None = None
        self.since_best = 0

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of this watch: the values seen and the observations since the best."""
        return {"metric": self.cfg.metric, "latest": self.latest, "best": self.best, "since_best": self.since_best}

    def load(self, state: dict[str, Any]) -> None:
        """Continue from `state` (a resumed run); a watch of another metric starts afresh."""
        if state.get("metric") == self.cfg.metric:
            self.latest, self.best, self.since_best = state["latest"], state["best"], state["since_best"]

    def better(self, value: float, than: float | None) -> bool:
        if than is None:
            return True
        gain = value - than if self.cfg.mode == "max" else than - value
        return gain > self.cfg.min_delta

    def observe(self, source: str, metrics: dict[str, float]) -> None:
        """Take the metric from one event's metrics (``source`` "" for a step, "eval" for an evaluation)."""
        if source != self.source:
            return
        if self.key not in metrics:
            where = f"{self.source} metrics" if self.source else "step metrics"
            raise ConfigError(f"{self.field}.metric={self.cfg.metric!r}: the {where} have no {self.key!r}; they have "
                              f"{sorted(metrics)} (an evaluation's as eval/NAME)")
        self.latest = float(metrics[self.key])
        if self.better(self.latest, self.best):
            self.best, self.since_best = self.latest, 0
        else:
            self.since_best += 1


def keep_best(checkpoint: str, step: int, metric: str, value: float, policy: RetryPolicy | None = None) -> str:
    """Make ``checkpoints/best`` the checkpoint ``checkpoint`` (local: hard-linked files, copies where links fail;
    a URL: copied on the store, its marker last), replacing the previous best; returns its location."""
    info = json.dumps({"step": step, "metric": metric, "value": value})
    if is_remote(checkpoint):
        run, name = checkpoint.rsplit("/checkpoints/", 1)
        remote = RemoteDir(run, policy)
        remote.copy_tree(f"checkpoints/{name}", f"checkpoints/{BEST}", skip=COMPLETE)
        remote.write_bytes(f"checkpoints/{BEST}/best.json", info.encode())
        remote.write_bytes(f"checkpoints/{BEST}/{COMPLETE}", remote.read_bytes(f"checkpoints/{name}/{COMPLETE}"))
        return f"{run}/checkpoints/{BEST}"
    return str(_keep_best_here(Path(checkpoint), info))


def _keep_best_here(checkpoint: Path, info: str) -> Path:
    best = checkpoint.parent / BEST
    staging = best.with_name(BEST + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(checkpoint, staging, copy_function=_link_or_copy)
    (staging / "best.json").write_text(info)
    old = best.with_name(BEST + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if best.exists():
        os.replace(best, old)
    os.replace(staging, best)
    shutil.rmtree(old, ignore_errors=True)
    return best


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)
