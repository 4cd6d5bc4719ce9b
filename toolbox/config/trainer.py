"""The ``trainer`` section (`TrainerConfig`): the driver loop's length, evaluation, checkpoints, early stopping and the
best checkpoint (`WatchConfig`, `EarlyStopConfig`), profiling, where results go and how a run resumes."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from toolbox.core.errors import ConfigError
from toolbox.core.retry import RetryPolicy
from toolbox.core.storage import check_location


class WatchConfig(BaseModel):
    """One metric a run watches (`toolbox.trainers.watch`)."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field(description="A step metric (reward, loss) or an evaluation's as eval/NAME (eval/reward).")
    mode: Literal["max", "min"] = Field("max", description="Whether higher (max) or lower (min) is better.")
    min_delta: float = Field(0.0, ge=0, description="Smallest change that counts as an improvement.")


class EarlyStopConfig(WatchConfig):
    """Stop the run when the metric has not improved for ``patience`` observations."""

    patience: int = Field(3, ge=1, description="Observations of the metric (steps, or evaluations for eval/NAME) "
                          "without improvement after which the run stops, with a final checkpoint.")


class TrainerConfig(BaseModel):
    """The driver loop: length, evaluation, checkpoints, where results go."""

    model_config = ConfigDict(extra="forbid")
    total_steps: int = Field(100, ge=1, description="Training steps (one rollout + update + weight sync each).")
    save_every: int = Field(10, ge=0, description="Checkpoint every N steps, and always at the end (0: only at the "
                            "end). Each checkpoint is staged and renamed to step_N only once complete.")
    keep_checkpoints: int = Field(2, ge=0, description="Complete checkpoints to keep in RUN_DIR/checkpoints (the newest; "
                                  "0: keep all).")
    eval_every: int = Field(0, ge=0, description="Evaluate every N steps (0: never during training).")
    eval_prompts: int = Field(32, ge=1, description="Held-out prompts per evaluation (greedy decoding).")
    final_eval: bool = Field(True, description="Evaluate once more at the end of the run (after its last "
                             "checkpoint, unless the last step was just evaluated), whatever eval_every says.")
    early_stop: EarlyStopConfig | None = Field(None, description="Stop when a metric stops improving: {metric: "
                                               "eval/reward, patience: 3}. Unset: run total_steps.")
    profile_steps: list[int] = Field(default_factory=list, description="Training steps (1 = the first) to record "
                                     "with torch.profiler on every learner rank: RUN_DIR/profile/step_N/rank_R.pt.trace"
                                     ".json, Chrome traces that Perfetto opens and TensorBoard's profiler plugin lists "
                                     "(tensorboard --logdir RUN_DIR/profile).")
    keep_best: WatchConfig | None = Field(None, description="Keep the checkpoint saved at the best value of a metric "
                                          "in RUN_DIR/checkpoints/best (beside the newest keep_checkpoints): "
                                          "{metric: eval/reward}.")
    seed: int = Field(0, description="Seed of prompts, sampling and initialisation.")
    run_root: str = Field("runs", description="Directory under which each run gets its own directory: a path, or "
                          "a URL of a filesystem fsspec knows (s3://, gs://, az://, hf://, memory://; its package "
                          "installed): the learner ranks write each checkpoint straight to it, the driver's files (config, "
                          "metrics, samples) are staged locally in staging_root and published at every checkpoint "
                          "and at the end (docs/storage.md).")
    staging_root: str = Field("", description="With a remote run_root: the driver's local directory the run's "
                              "files but its checkpoints are written to before they are published (and, on several "
                              "nodes, a tiny model or a cold start is built in: then shared, with shared_fs); "
                              "empty: <tmp>/toolbox-staging.")
    run_name: str = Field("", description="Run directory name; empty: '<experiment>-<timestamp>'.")
    resume_from: str = Field("", description="'auto': the newest complete checkpoint of this run's directory (needs "
                             "run_name), or a fresh start when there is none; a run directory: its newest complete "
                             "checkpoint; a checkpoint directory (runs/x/checkpoints/step_N): itself. A URL of "
                             "either (s3://.../step_N): the same, read from the store by every learner rank.")
    export: bool = Field(False, description="At the end of training, write the final policy as a Hugging Face model "
                         "directory (safetensors, config, tokenizer, generation config) to RUN_DIR/hf (LLM algorithms).")
    log_samples_every: int = Field(10, ge=0, description="Every N steps (from the first), record a few prompts' "
                                   "samples (text, token ids, behaviour log-probs, reward and its components, "
                                   "advantage, finish reason) to "
                                   "RUN_DIR/samples.jsonl and the trackers (rollout-based algorithms); 0: never.")
    log_samples: int = Field(4, ge=1, description="Prompts recorded each time, with every sample of their group.")
    shared_fs: bool = Field(False, description="Assert that run_root is on a filesystem every Ray node sees (NFS, a "
                            "Kubernetes RWX volume, the same machine): required on a cluster of more than one node "
                            "for a local run_root, where learner ranks on other nodes write the checkpoints; with a "
                            "remote run_root, only for what the driver builds on its disk (model.tiny, cold_start, "
                            "gguf_file) or the ranks write beside the run (profile_steps); asserts it of "
                            "staging_root then.")
    storage_retry: RetryPolicy = Field(default_factory=RetryPolicy, description="How a call to a remote run_root or "
                                       "resume_from is tried again after a connection failure or a timeout (the one "
                                       "retry policy: backoff with full jitter, a deadline; docs/storage.md).")

    @model_validator(mode="after")
    def _watched(self) -> TrainerConfig:
        for name in ("early_stop", "keep_best"):
            watch = getattr(self, name)
            if watch is not None and watch.metric.startswith("eval/") and not self.eval_every:
                raise ConfigError(f"trainer.{name}.metric={watch.metric!r} is an evaluation's metric and "
                                  "trainer.eval_every is 0 (set eval_every, or watch a step metric)")
        outside = [step for step in self.profile_steps if not 1 <= step <= self.total_steps]
        if outside:
            raise ConfigError(f"trainer.profile_steps={self.profile_steps}: {outside} outside the run's steps "
                              f"1..{self.total_steps} (trainer.total_steps; 1 is the first step), so nothing would "
                              "be recorded there")
        return self

    @field_validator("run_root", "resume_from")
    @classmethod
    def _location(cls, value: str, info: ValidationInfo) -> str:
        """A URL's filesystem must be one fsspec knows and can load, checked before anything starts."""
        if info.field_name == "resume_from" and value in ("", "auto"):
            return value
        return check_location(f"trainer.{info.field_name}", value, writable=info.field_name == "run_root")
