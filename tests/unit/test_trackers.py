"""Tracker callbacks fed events directly, each read back from what it stored: samples.jsonl, TensorBoard event
files, an offline W&B run (its transaction log) and a local MLflow store (through `MlflowClient`). A fake secret
in the saved config must reach none of them; a tracker whose package is missing fails at config load."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.unit.wandb_offline import read_offline_run
from toolbox.callbacks import CALLBACKS
from toolbox.config import load_config
from toolbox.config.loader import dump_config
from toolbox.core.errors import ConfigError
from toolbox.core.events import Event, EventBus
from toolbox.tracing.datasets import read_samples
from toolbox.tracing.entries import (
    SAMPLE_COLUMNS,
    Histogram,
    SampleInputs,
    SampleOutputs,
    SampleTrace,
    StepSamples,
)

SECRET = "sk-FAKE-0123456789-never-stored"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory whose saved config holds a key in plain text (as a careless component might keep one)."""
    path = tmp_path / "grpo_tiny-run"
    path.mkdir()
    dump_config(load_config([]), path / "config.yaml")
    saved = yaml.safe_load((path / "config.yaml").read_text())
    saved["rollout"]["engine"].update(api_key=SECRET, api_key_env="MY_KEY_ENV")
    saved["reward"]["spec"]["judge_token"] = SECRET
    (path / "config.yaml").write_text(yaml.safe_dump(saved))
    return path


def traces(step: int) -> StepSamples:
    def trace(group: int, response: str, reward: float | None, state: str, reason: str = "") -> SampleTrace:
        return SampleTrace(step=step, role="rollout", rank=group % 2, timing={"generate_s": 0.5},
                           inputs=SampleInputs(prompt="1+1=", group=group, extras={"answer": "2"}),
                           outputs=SampleOutputs(response=response, response_tokens=len(response), finish_reason="stop",
                                                 reward=reward, reward_state=state, reward_reason=reason,  # type: ignore[arg-type]
                                                 reward_components={"math": reward} if reward is not None else {},
                                                 advantage=0.5 if reward is not None else None))
    hist = Histogram.of(torch.tensor([0.0, 1.0, 1.0]))
    assert hist is not None
    return StepSamples(step, [trace(0, "2 | two\nlines", 1.0, "ok"), trace(0, "3", None, "error", "ValueError: boom")],
                       {"reward": hist, "advantage": hist})


def feed(callback: Any) -> None:
    """Two steps, samples at step 1, an evaluation at step 2, the end of the run."""
    bus = EventBus()
    callback.attach(bus)
    bus.emit(Event.FIT_START, {"start_step": 0, "total_steps": 2})
    bus.emit(Event.SAMPLES, {"step": 1, "samples": traces(1)})
    bus.emit(Event.STEP_END, {"step": 1, "metrics": {"reward": 0.25, "kl": float("nan"), "reward_error/ValueError: boom": 1.0}})
    bus.emit(Event.STEP_END, {"step": 2, "metrics": {"reward": 0.5, "kl": 0.01, "reward_error/ValueError: boom": 0.0}})
    bus.emit(Event.EVAL_END, {"step": 2, "metrics": {"reward": 0.75}})
    bus.emit(Event.FIT_END, {"step": 2, "summary": {"steps": 2, "experiment": "grpo_tiny"}})


def assert_no_secret(root: Path) -> None:
    leaked = [p for p in root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, f"the fake key reached {leaked}"


def test_jsonl_writes_samples_that_read_back_as_traces(run_dir: Path) -> None:
    feed(CALLBACKS.build({"name": "jsonl"}, inject={"run_dir": run_dir}))
    assert read_samples(run_dir / "samples.jsonl") == traces(1).samples
    assert "samples" not in (run_dir / "metrics.jsonl").read_text()  # metrics.jsonl keeps to metric events


def test_tensorboard_gets_a_sample_table_and_reward_and_advantage_histograms(run_dir: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    feed(CALLBACKS.build({"name": "tensorboard"}, inject={"run_dir": run_dir}))
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0, "histograms": 0})
    events.Reload()
    assert {"train/reward_hist", "train/advantage_hist"} <= set(events.Tags()["histograms"])
    (hist,) = events.Histograms("train/reward_hist")
    assert (hist.step, hist.histogram_value.num, hist.histogram_value.max) == (1, 3, 1.0)
    (text,) = events.Tensors("samples/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert table.splitlines()[0] == "| " + " | ".join(SAMPLE_COLUMNS) + " |"
    assert "2 \\| two⏎ lines" in table and "ValueError: boom" in table  # one row per sample, cells escaped


def test_wandb_offline_run_holds_config_metrics_samples_and_no_secret(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    feed(CALLBACKS.build({"name": "wandb", "mode": "offline", "project": "toolbox-test"}, inject={"run_dir": run_dir}))
    run = read_offline_run(run_dir)
    assert run.config["learner"]["optim"]["lr"] == load_config([]).learner.optim.lr
    assert run.config["rollout"]["engine"]["api_key"] == "**********"
    assert run.config["rollout"]["engine"]["api_key_env"] == "MY_KEY_ENV"  # the name of a variable is no secret
    assert run.history[1]["train/reward"] == 0.25 and run.history[2]["train/reward"] == 0.5
    assert run.history[2]["eval/reward"] == 0.75 and math.isnan(run.history[1]["train/kl"])
    assert run.history[1]["train/reward_hist/_type"] == "histogram"
    (table,) = (run.directory / "files" / "media" / "table").glob("samples_*.table.json")
    stored = json.loads(table.read_text())
    assert stored["columns"] == list(SAMPLE_COLUMNS) and len(stored["data"]) == 2
    assert stored["data"][1][SAMPLE_COLUMNS.index("reward_reason")] == "ValueError: boom"
    assert_no_secret(run_dir / "wandb")


def test_mlflow_store_holds_params_metrics_samples_and_no_secret(run_dir: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    tracker = CALLBACKS.build({"name": "mlflow", "tracking_uri": f"file:{store}"}, inject={"run_dir": run_dir})
    feed(tracker)
    client = MlflowClient(tracking_uri=f"file:{store}")
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert client.get_experiment(run.info.experiment_id).name == "grpo_tiny"
    assert float(run.data.params["learner.optim.lr"]) == load_config([]).learner.optim.lr
    assert len(run.data.params) > 100  # more than one log_batch of params
    assert run.data.params["rollout.engine.api_key"] == "**********"
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "train/reward")] == [(1, 0.25), (2, 0.5)]
    assert [m.value for m in client.get_metric_history(tracker.run_id, "eval/reward")] == [0.75]
    # A reason in a metric name has characters MLflow refuses: they become "_".
    assert [m.step for m in client.get_metric_history(tracker.run_id, "train/reward_error/ValueError_ boom")] == [1, 2]
    local = client.download_artifacts(tracker.run_id, "samples/step_000001.jsonl", str(tmp_path))
    assert read_samples(local) == traces(1).samples
    assert_no_secret(store)


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_tracker_without_its_package_fails_at_config_load_naming_the_extra(name: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import toolbox.callbacks.trackers as trackers

    monkeypatch.setattr(trackers, "find_spec", lambda module: None)
    with pytest.raises(ConfigError, match=rf"callbacks\.1: .*the {name} callback needs the '{name}' extra: "
                                          rf"pip install 'toolbox\[{name}\]' \({name} is not installed\)"):
        load_config([f"callbacks=[{{name: console}}, {{name: {name}}}]"])
