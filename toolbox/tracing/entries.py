"""Trace entries: one typed record per thing a role did at a step (its inputs, outputs and timing).

A `SampleTrace` is one sampled completion as the rollout side made it and the reward and learner saw it:
the prompt, the response, its reward (value, three-state status, error reason, the components of a
composite reward), its advantage and finish reason; for a multi-turn episode, every turn and tool call
(`toolbox.tracing.episodes`). They are written to ``RUN_DIR/samples.jsonl`` one per
line and read back (validated) by ``toolbox traces``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolbox.tracing.episodes import TurnRecord

if TYPE_CHECKING:  # the driver imports this module before it needs torch (start-up)
    import torch

RewardState = Literal["ok", "abstain", "error"]
FinishReason = Literal["stop", "length"]


class TraceEntry(BaseModel):
    """What every trace entry says: when (step), who (role and rank) and how long it took (timing)."""

    model_config = ConfigDict(extra="forbid")
    step: int = Field(ge=1, description="Training step (1-based, as in metrics.jsonl) the entry belongs to.")
    role: str = Field(description="The role that produced the outputs: rollout, reward, learner.")
    rank: int = Field(ge=0, description="The worker of that role (rollout shard i of a round goes to worker i % n).")
    timing: dict[str, float] = Field(default_factory=dict, description="Seconds spent, by phase (generate_s, "
                                     "reward_s: of the shard this entry came from).")


class SampleInputs(BaseModel):
    """What the engine was given."""

    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(description="The prompt as the model saw it, decoded (special tokens dropped).")
    group: int = Field(description="The prompt's group in its step: samples of one group share the prompt.")
    extras: dict[str, Any] = Field(default_factory=dict, description="The row's metadata for the reward (the "
                                   "reference answer).")
    prompt_ids: list[int] = Field(default_factory=list, description="The prompt's token ids as the engine got them "
                                  "(what a run trained from stored rollouts conditions on).")


class SampleOutputs(BaseModel):
    """What came out of generation, reward and the learner's plan for one sample."""

    model_config = ConfigDict(extra="forbid")
    response: str = Field(description="The sampled completion, decoded (special tokens dropped).")
    response_tokens: int = Field(ge=0, description="Response length in tokens.")
    finish_reason: FinishReason = Field(description="stop: EOS or a stop token; length: max_new_tokens reached.")
    reward: float | None = Field(description="The reward; null when it abstained or errored.")
    reward_state: RewardState = Field(description="ok, abstain, or error (then `reward_reason` says why).")
    reward_reason: str = Field("", description="Why the reward abstained or errored.")
    reward_components: dict[str, float | None] = Field(
        default_factory=dict, description="Each component's value of a composite reward (weighted_sum), "
        "unweighted; null where a component abstained.")
    advantage: float | None = Field(None, description="The sample's advantage where the algorithm computes one "
                                    "per sample when planning the step (GRPO and its variants); null otherwise.")
    trained: bool = Field(True, description="Whether the sample is in the step's update (false: its group was "
                          "dropped by dynamic sampling, or its reward did not score).")
    turns: list[TurnRecord] = Field(default_factory=list, description="A multi-turn episode's messages after the "
                                    "prompt, in order (model turns with their tool calls, environment replies); "
                                    "empty for a single completion.")
    response_ids: list[int] = Field(default_factory=list, description="The response's token ids (response_tokens "
                                    "of them).")
    logprobs: list[float] = Field(default_factory=list, description="The behaviour policy's log-prob of each response "
                                  "token, as the engine sampled it: what importance-corrects a run trained from "
                                  "these samples (algorithm.name=offline_grpo).")


SAMPLE_COLUMNS = ("step", "rank", "group", "prompt", "response", "reward", "reward_state", "reward_reason",
                  "reward_components", "advantage", "finish_reason", "response_tokens", "trained")


class SampleTrace(TraceEntry):
    """One sampled completion of a recorded prompt."""

    inputs: SampleInputs = Field(description="The prompt side.")
    outputs: SampleOutputs = Field(description="The completion, its reward and advantage.")

    def row(self) -> dict[str, Any]:
        """One flat table row (`SAMPLE_COLUMNS`, in order): what a tracker's sample table shows."""
        i, o = self.inputs, self.outputs
        return {"step": self.step, "rank": self.rank, "group": i.group, "prompt": i.prompt, "response": o.response,
                "reward": o.reward, "reward_state": o.reward_state, "reward_reason": o.reward_reason,
                "reward_components": json.dumps(o.reward_components) if o.reward_components else "",
                "advantage": o.advantage, "finish_reason": o.finish_reason, "response_tokens": o.response_tokens,
                "trained": o.trained}


@dataclass(frozen=True)
class TraceRequest:
    """What the loop asks learner rank 0 to record at a step: ``prompts`` whole groups (every sample of each)."""

    step: int
    prompts: int
    rollout_workers: int


@dataclass
class Histogram:
    """Many values summed up in a fixed number of bins (what TensorBoard and W&B histograms take): its size does not
    grow with the batch, so the driver can receive it every recorded step. ``edges`` has one more entry than
    ``counts``."""

    num: int
    min: float
    max: float
    sum: float
    sum_squares: float
    edges: list[float]
    counts: list[float]

    @staticmethod
    def of(values: torch.Tensor, bins: int = 30) -> Histogram | None:
        """The histogram of ``values`` (``None`` for none); all-equal values get one bin around them."""
        import torch

        x = values.detach().double().flatten()
        if x.numel() == 0:
            return None
        low, high = float(x.min()), float(x.max())
        if low == high:
            edges, counts = [low - 0.5, high + 0.5], [float(x.numel())]
        else:
            edges = torch.linspace(low, high, bins + 1, dtype=torch.float64).tolist()
            counts = torch.histc(x, bins, low, high).tolist()
        return Histogram(int(x.numel()), low, high, float(x.sum()), float((x * x).sum()), edges, counts)


@dataclass
class StepSamples:
    """What rank 0 hands back for a recorded step: a few whole groups of samples, and histograms of the step's
    rewards (scored samples) and advantages (rows in the update, where the plan has them)."""

    step: int
    samples: list[SampleTrace]
    histograms: dict[str, Histogram] = field(default_factory=dict)
