"""Learner rank 0 records a few prompts of a step: every sample of their groups, decoded, with reward and advantage.

Rank 0's plan already reads the whole step (every rollout shard and its rewards) and computes the
advantages, so it is where a sample's whole story is known. Only the recorded rows are decoded, and
what leaves the rank is a few strings and fixed-size histograms of the step's rewards and advantages:
nothing that grows with the batch.
"""

from __future__ import annotations

from typing import Any

import torch

from toolbox.rewards.base import RewardResult, RewardStatus
from toolbox.rewards.runner import decode_samples
from toolbox.rl.batch import FINISH_LENGTH, RolloutBatch
from toolbox.rl.plan import StepPlan
from toolbox.tracing.entries import (
    Histogram,
    SampleInputs,
    SampleOutputs,
    SampleTrace,
    StepSamples,
    TraceRequest,
)
from toolbox.tracing.episodes import TRACE_KEY, TurnRecord


def recorded_rows(group_B: torch.Tensor, prompts: int) -> torch.Tensor:
    """The rows of the first ``prompts`` groups of the step, in row order (whole groups, so DPO pairs can be made)."""
    groups = list(dict.fromkeys(group_B.tolist()))[:prompts]
    return torch.isin(group_B, torch.tensor(groups, dtype=group_B.dtype)).nonzero().squeeze(1)


def sample_traces(request: TraceRequest, shards: list[RolloutBatch], results: list[RewardResult], plan: StepPlan,
                  tokenizer: Any) -> StepSamples:
    """The traces of ``request.prompts`` whole groups of the step ``plan`` was made from, and its rewards and
    advantages. ``tokenizer`` decodes only the recorded rows."""
    batch, rewards = RolloutBatch.concat(shards), RewardResult.concat(results)
    shard_B = torch.repeat_interleave(torch.arange(len(shards)), torch.tensor([len(s) for s in shards]))
    kept = torch.cat(plan.rank_rows) if plan.rank_rows else torch.zeros(0, dtype=torch.long)
    advantages = plan.row_advantages()
    advantage_of = dict(zip(kept.tolist(), advantages.tolist())) if advantages is not None else {}
    trained = set(kept[rewards.ok_B[kept]].tolist())
    rows = recorded_rows(batch.group_B, request.prompts)
    texts = decode_samples(batch.select(rows), tokenizer)
    samples = []
    for row, text in zip(rows.tolist(), texts):
        shard = int(shard_B[row])
        samples.append(SampleTrace(
            step=request.step, role="rollout", rank=shard % request.rollout_workers,
            timing={"generate_s": shards[shard].seconds, "reward_s": results[shard].seconds},
            inputs=SampleInputs(prompt=text.prompt, group=int(batch.group_B[row]),
                                extras={k: v for k, v in text.extras.items() if k != TRACE_KEY},
                                prompt_ids=batch.prompt_ids_BP[row][batch.prompt_mask_BP[row].bool()].tolist()),
            outputs=_outputs(text.response, batch, rewards, row, advantage_of.get(row), row in trained,
                             text.extras.get(TRACE_KEY, []))))
    histograms = {"reward": Histogram.of(rewards.values_B[rewards.ok_B]),
                  "advantage": None if advantages is None else Histogram.of(advantages[rewards.ok_B[kept]])}
    return StepSamples(request.step, samples, {k: h for k, h in histograms.items() if h is not None})


def _outputs(response: str, batch: RolloutBatch, rewards: RewardResult, row: int, advantage: float | None,
             trained: bool, turns: list[dict[str, Any]]) -> SampleOutputs:
    state = RewardStatus(int(rewards.status_B[row]))
    components = getattr(rewards, "components", None) or []
    n = int(batch.response_lengths_B[row])
    return SampleOutputs(
        response=response, response_tokens=n, response_ids=batch.response_ids_BR[row, :n].tolist(),
        logprobs=[round(x, 6) for x in batch.logprobs_BR[row, :n].tolist()],
        finish_reason="length" if int(batch.finish_B[row]) == FINISH_LENGTH else "stop",
        reward=float(rewards.values_B[row]) if state == RewardStatus.OK else None,
        reward_state=state.name.lower(),  # type: ignore[arg-type]  # OK/ABSTAIN/ERROR -> the Literal's values
        reward_reason=rewards.reasons[row], reward_components=components[row] if components else {},
        advantage=advantage, trained=trained, turns=[TurnRecord.model_validate(t) for t in turns])
