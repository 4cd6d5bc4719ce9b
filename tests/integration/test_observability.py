"""A whole tiny GRPO run that records samples every step and logs to W&B (offline) and MLflow (a local file store):
samples.jsonl, the offline W&B run and the MLflow run are read back.

It runs with ``ray.local_mode`` (the real workers, learner and callbacks in-process): starting actors would
cost most of the test's time and prove nothing more here. The Ray path of recording (rank 0's plan ref handed
to its `samples` call, the small fetch) runs in every GRPO test on Ray, since `trainer.log_samples_every`
records the first step by default, and `test_grpo_ray.py` checks the driver's fetches stay small."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.wandb_offline import read_offline_run
from toolbox.commands.traces import main as traces_main
from toolbox.config import load_config
from toolbox.data.offline import load_records
from toolbox.driver.experiment import ExperimentBuilder
from toolbox.tracing.datasets import read_samples

pytestmark = pytest.mark.integration

GROUP, PROMPTS = 4, 2


def test_grpo_records_samples_to_jsonl_wandb_and_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_SILENT", "true")
    store = f"file:{tmp_path / 'mlruns'}"
    cfg = load_config([
        f"trainer.run_root={tmp_path}", "trainer.total_steps=2", "trainer.eval_every=0", "trainer.log_samples_every=1",
        f"trainer.log_samples={PROMPTS}", "algorithm.prompts_per_step=2", f"algorithm.group_size={GROUP}",
        "ray.local_mode=true", "rollout.num_workers=2", "reward.num_workers=1", "learner.num_workers=1",
        "learner.strategy=single", "learner.micro_batch_size=8",
        f"callbacks=[{{name: jsonl}}, {{name: wandb, mode: offline}}, {{name: mlflow, tracking_uri: '{store}'}}]",
    ])
    builder = ExperimentBuilder(cfg)
    try:
        builder.build_trainer().fit()
    finally:
        builder.shutdown()
    run_dir = builder.run_dir

    samples = read_samples(run_dir / "samples.jsonl")
    assert [s.step for s in samples] == [1] * (PROMPTS * GROUP) + [2] * (PROMPTS * GROUP)
    assert {s.inputs.group for s in samples} == set(range(PROMPTS))  # whole groups of the first prompts
    assert [s.rank for s in samples[:2 * GROUP]] == [0] * GROUP + [1] * GROUP  # a group per rollout worker
    assert all(s.inputs.prompt.endswith("=") and s.inputs.extras["answer"] for s in samples)
    scored = [s for s in samples if s.outputs.reward_state == "ok"]
    assert scored and all(s.outputs.advantage is not None and s.outputs.trained for s in scored)
    assert all(s.timing["generate_s"] > 0 for s in samples)
    # The recorded groups as an SFT dataset (every group's best scored response), read by the SFT trainer's reader.
    assert traces_main([str(run_dir), "--to", "sft", "--min-reward", "-1", str(tmp_path / "sft.jsonl")]) == 0
    rows = load_records(tmp_path / "sft.jsonl", "sft")
    assert rows and {r["prompt"] for r in rows} <= {s.inputs.prompt for s in samples}

    wandb_run = read_offline_run(run_dir)
    assert wandb_run.config["algorithm"]["group_size"] == GROUP
    assert {1, 2} <= wandb_run.history.keys() and "train/reward" in wandb_run.history[2]
    assert wandb_run.history[1]["samples/_type"] == "table-file"
    assert wandb_run.history[1]["train/reward_hist/_type"] == "histogram"

    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.experiment).experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["algorithm.group_size"] == str(GROUP)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/reward")] == [1, 2]
    assert [a.path for a in client.list_artifacts(run.info.run_id, "samples")] == [
        "samples/step_000001.jsonl", "samples/step_000002.jsonl"]
