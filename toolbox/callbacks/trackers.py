"""Experiment trackers as callbacks: Weights & Biases (``wandb``) and MLflow (``mlflow``), each an optional extra.

Each subscribes to the event bus like any callback (the loop knows no tracker): step metrics as
``train/*``, evaluations as ``eval/*``, recorded samples as a W&B table or an MLflow artifact,
and the run's config as parameters. Choosing one whose package is missing fails when the config
loads, naming the extra to install.

The parameters are the run's saved ``RUN_DIR/config.yaml`` (what `toolbox.config.loader.dump_config`
wrote, so secrets are masked as there), with every value under a secret-looking key (``api_key``,
``token``, ``password``, ``secret``) masked again: a component that keeps a key as plain text still
does not send it.
"""

from __future__ import annotations

import json
import math
import os
import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolbox.callbacks import CALLBACKS
from toolbox.core.events import Event, EventBus
from toolbox.core.extras import needs_extra
from toolbox.tracing.entries import SAMPLE_COLUMNS, StepSamples

MASK = "**********"
SECRET_KEY = re.compile(r"(api_key|apikey|secret|password|token)$", re.IGNORECASE)


def require_extra(module: str, extra: str) -> None:
    """Refuse a tracker whose package is not installed, naming the extra to install (at config load)."""
    if find_spec(module) is None:
        raise ValueError(needs_extra(f"the {extra} callback", extra, f"{module} is not installed"))


def masked(value: Any) -> Any:
    """``value`` with every non-empty string under a secret-looking key replaced by a mask, recursively."""
    if isinstance(value, dict):
        return {k: MASK if SECRET_KEY.search(str(k)) and isinstance(v, str) and v else masked(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def tracked_config(run_dir: Path) -> dict[str, Any]:
    """The run's saved config (``RUN_DIR/config.yaml``), masked; empty where the run directory has none."""
    path = run_dir / "config.yaml"
    return masked(yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"learner.optim.lr": "0.002", ...}``: one string per leaf (a list of specs as JSON)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, path + "."))
        else:
            out[path] = value if isinstance(value, str) else json.dumps(value)
    return out


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics a tracker can plot: numbers (bools excluded)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class WandbConfig(BaseModel):
    """Options of the Weights & Biases callback (``pip install 'toolbox[wandb]'``)."""

    model_config = ConfigDict(extra="forbid")
    project: str = Field("toolbox", description="W&B project.")
    entity: str = Field("", description="W&B entity (team or user); empty: your default.")
    run_name: str = Field("", description="Run name; empty: the run directory's name.")
    group: str = Field("", description="Run group (e.g. a sweep's name); empty: none.")
    tags: list[str] = Field(default_factory=list, description="Run tags.")
    mode: Literal["", "online", "offline", "disabled"] = Field(
        "", description="online, offline (files under RUN_DIR/wandb, `wandb sync` later) or disabled; empty: "
        "WANDB_MODE, else online.")
    capture_console: bool = Field(False, description="Also send the run's console output to W&B.")

    @model_validator(mode="after")
    def _installed(self) -> WandbConfig:
        require_extra("wandb", "wandb")
        return self


class _Tracker:
    """What both trackers subscribe to: step and eval metrics, recorded samples, the end of the run."""

    def attach(self, bus: EventBus) -> None:
        bus.subscribe(Event.STEP_END, lambda e, p: self._log("train", p))
        bus.subscribe(Event.EVAL_END, lambda e, p: self._log("eval", p))
        bus.subscribe(Event.SAMPLES, self._samples)
        bus.subscribe(Event.FIT_END, self._end)

    def _log(self, prefix: str, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    def _samples(self, _: Event, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    def _end(self, _: Event, payload: dict[str, Any]) -> None:
        raise NotImplementedError


@CALLBACKS.register("wandb", config=WandbConfig)
class WandbTracker(_Tracker):
    """Logs metrics, evaluations, sample tables and reward/advantage histograms to one W&B run per experiment run.

    Its files live in ``RUN_DIR/wandb``; in offline mode that is the whole record (``wandb sync`` uploads it).
    """

    def __init__(self, config: WandbConfig, run_dir: Path) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=config.project, entity=config.entity or None, name=config.run_name or run_dir.name,
            group=config.group or None, tags=config.tags or None, dir=str(run_dir), mode=config.mode or None,
            config=tracked_config(run_dir), reinit="create_new",
            settings=wandb.Settings(console="auto" if config.capture_console else "off"))

    def _log(self, prefix: str, payload: dict[str, Any]) -> None:
        metrics = numeric(payload["metrics"])
        self.run.log({f"{prefix}/{k}": v for k, v in metrics.items()}, step=payload["step"])

    def _samples(self, _: Event, payload: dict[str, Any]) -> None:
        recorded: StepSamples = payload["samples"]
        data: dict[str, Any] = {"samples": self.wandb.Table(columns=list(SAMPLE_COLUMNS),
                                                            data=[list(s.row().values()) for s in recorded.samples])}
        for name, h in recorded.histograms.items():
            data[f"train/{name}_hist"] = self.wandb.Histogram(np_histogram=(np.asarray(h.counts), np.asarray(h.edges)))
        self.run.log(data, step=payload["step"])

    def _end(self, _: Event, payload: dict[str, Any]) -> None:
        self.run.summary.update(numeric(payload.get("summary", {})))
        self.run.finish()


class MlflowConfig(BaseModel):
    """Options of the MLflow callback (``pip install 'toolbox[mlflow]'``)."""

    model_config = ConfigDict(extra="forbid")
    tracking_uri: str = Field("", description="Tracking store or server: sqlite:///path.db, file:/dir, http://host; "
                              "empty: MLFLOW_TRACKING_URI, else sqlite:///RUN_DIR/mlflow.db.")
    experiment_name: str = Field("", description="MLflow experiment; empty: the config's `experiment`.")
    run_name: str = Field("", description="Run name; empty: the run directory's name.")
    tags: dict[str, str] = Field(default_factory=dict, description="Run tags.")

    @model_validator(mode="after")
    def _installed(self) -> MlflowConfig:
        require_extra("mlflow", "mlflow")
        return self


MLFLOW_BATCH = 100  # MLflow takes at most 100 params (and 1,000 metrics) per log_batch call
MLFLOW_VALUE_LIMIT = 6000  # longest param value MLflow stores


def mlflow_key(key: str) -> str:
    """``key`` with the characters MLflow refuses in names (``reward_error/ValueError: ...``) replaced by ``_``."""
    return re.sub(r"[^\w.\- /]", "_", key)


@CALLBACKS.register("mlflow", config=MlflowConfig)
class MlflowTracker(_Tracker):
    """One MLflow run per experiment run: the config as params, metrics per step, samples as JSONL artifacts.

    Uses an `MlflowClient` bound to its run (no global active run), so several runs can share a process.
    """

    def __init__(self, config: MlflowConfig, run_dir: Path) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = config.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run_dir / 'mlflow.db'}"
        if uri.startswith("file:"):  # MLflow 3 keeps the file store behind an opt-in; naming file: is that opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        params = tracked_config(run_dir)
        name = config.experiment_name or str(params.get("experiment") or "toolbox")
        found = self.client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=config.run_name or run_dir.name,
                                             tags=config.tags).info.run_id
        items = [Param(mlflow_key(k), v[:MLFLOW_VALUE_LIMIT]) for k, v in flat_params(params).items()]
        for i in range(0, len(items), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + MLFLOW_BATCH])

    def _log(self, prefix: str, payload: dict[str, Any]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(mlflow_key(f"{prefix}/{k}"), v, now, payload["step"]) for k, v in numeric(payload["metrics"]).items()
                 if not math.isinf(v)]
        for i in range(0, len(items), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + MLFLOW_BATCH])

    def _samples(self, _: Event, payload: dict[str, Any]) -> None:
        recorded: StepSamples = payload["samples"]
        text = "".join(s.model_dump_json() + "\n" for s in recorded.samples)
        self.client.log_text(self.run_id, text, f"samples/step_{payload['step']:06d}.jsonl")

    def _end(self, _: Event, payload: dict[str, Any]) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")
