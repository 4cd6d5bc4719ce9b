"""Sample traces: what learner rank 0 records of a step (text, reward three-state and components, advantage,
finish reason, rank), the composite reward's components through the real runner, and the loop's cadence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.test_trainer import FakeLearner, make_trainer
from toolbox.algorithms.grpo.learner import GRPOPlan
from toolbox.core.events import Event
from toolbox.rewards import REWARDS
from toolbox.rewards.base import RewardResult, RewardSample, RewardStatus
from toolbox.rewards.runner import RewardRunConfig, score_samples
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, RolloutBatch
from toolbox.rl.plan import StepPlan
from toolbox.tracing.entries import Histogram, StepSamples, TraceRequest
from toolbox.tracing.record import recorded_rows, sample_traces


class CharDecoder:
    """Token id = character code: enough of a tokenizer for `decode_samples`."""

    def batch_decode(self, rows: list[torch.Tensor], skip_special_tokens: bool = True) -> list[str]:
        return ["".join(chr(int(i)) for i in row) for row in rows]


def shard(prompts: list[str], responses: list[str], groups: list[int], finish: list[int], seconds: float) -> RolloutBatch:
    """Left-padded prompts, right-padded responses (pad id 0), one row per response."""
    p, r = max(map(len, prompts)), max(map(len, responses))
    prompt_ids = torch.tensor([[0] * (p - len(x)) + [ord(c) for c in x] for x in prompts])
    response_ids = torch.tensor([[ord(c) for c in x] + [0] * (r - len(x)) for x in responses])
    return RolloutBatch(prompt_ids, (prompt_ids > 0).long(), response_ids, (response_ids > 0).long(),
                        torch.zeros(response_ids.shape), torch.tensor(groups), torch.tensor(finish),
                        [{"answer": x[0]} for x in prompts], seconds=seconds)


def rewards(values: list[float], status: list[int], reasons: list[str], seconds: float,
            components: list[dict[str, float | None]] | None = None) -> RewardResult:
    return RewardResult(torch.tensor(values), torch.tensor(status), reasons, seconds, components=components or [])


OK, ABSTAIN, ERROR = int(RewardStatus.OK), int(RewardStatus.ABSTAIN), int(RewardStatus.ERROR)


def step_of_three_groups() -> tuple[list[RolloutBatch], list[RewardResult]]:
    """Groups 0 and 1 (two samples each) in shard 0, group 2 in shard 1; one error, one abstention."""
    shards = [shard(["1+1=", "1+1=", "2+2=", "2+2="], ["2", "3", "4", "44"], [0, 0, 1, 1],
                    [FINISH_STOP, FINISH_STOP, FINISH_STOP, FINISH_LENGTH], seconds=1.5),
              shard(["3+3=", "3+3="], ["6", "x"], [2, 2], [FINISH_STOP, FINISH_STOP], seconds=2.5)]
    parts = [{"math": 1.0, "format": 1.0}, {"math": 0.0, "format": None}, {"math": 1.0, "format": 1.0}, {}]
    results = [rewards([1.2, 0.0, 1.2, 0.0], [OK, OK, OK, ERROR], ["", "", "", "ValueError: boom"], 0.25, parts),
               rewards([1.0, 0.0], [OK, ABSTAIN], ["", "abstained"], 0.5)]
    return shards, results


def grpo_plan(rank_rows: list[list[int]], advantages: list[list[float]]) -> GRPOPlan:
    return GRPOPlan(shard_rows=[4, 2], rank_rows=[torch.tensor(r) for r in rank_rows], response_width=2, metrics={},
                    advantages=[torch.tensor(a) for a in advantages],
                    valid=[torch.ones(len(r), dtype=torch.bool) for r in rank_rows])


def test_recorded_rows_are_whole_groups_in_row_order() -> None:
    assert recorded_rows(torch.tensor([3, 3, 1, 1, 7, 7]), 2).tolist() == [0, 1, 2, 3]
    assert recorded_rows(torch.tensor([0, 0, 1, 1]), 5).tolist() == [0, 1, 2, 3]


def test_traces_of_recorded_groups_carry_text_reward_state_components_advantage_and_rank() -> None:
    shards, results = step_of_three_groups()
    # Two learner ranks: rank 0 trains on rows 0-2, rank 1 on rows 3-5.
    plan = grpo_plan([[0, 1, 2], [3, 4, 5]], [[0.7, -0.7, 0.5], [-0.5, 0.0, 0.0]])
    recorded = sample_traces(TraceRequest(step=7, prompts=2, rollout_workers=2), shards, results, plan, CharDecoder())
    assert [(s.inputs.prompt, s.outputs.response) for s in recorded.samples] == [
        ("1+1=", "2"), ("1+1=", "3"), ("2+2=", "4"), ("2+2=", "44")]
    first, errored = recorded.samples[0], recorded.samples[3]
    assert (first.step, first.role, first.rank, first.inputs.group, first.inputs.extras) == (7, "rollout", 0, 0, {"answer": "1"})
    assert first.outputs.reward == pytest.approx(1.2) and first.outputs.reward_state == "ok"
    assert first.outputs.reward_components == {"math": 1.0, "format": 1.0}
    assert recorded.samples[1].outputs.reward_components == {"math": 0.0, "format": None}
    assert first.outputs.advantage == pytest.approx(0.7) and first.outputs.trained
    assert first.timing == {"generate_s": 1.5, "reward_s": 0.25}
    # The errored sample: no reward, its reason, not trained on; it hit max_new_tokens.
    assert (errored.outputs.reward, errored.outputs.reward_state, errored.outputs.reward_reason) == (
        None, "error", "ValueError: boom")
    assert not errored.outputs.trained and errored.outputs.finish_reason == "length"
    assert errored.outputs.response_tokens == 2 and first.outputs.finish_reason == "stop"
    # Histograms: every scored reward (4 of 6), the advantages of trained rows (rows 0, 1, 2, 4).
    assert recorded.histograms["reward"].num == 4 and recorded.histograms["reward"].max == pytest.approx(1.2)
    adv = recorded.histograms["advantage"]
    assert adv.num == 4 and adv.sum == pytest.approx(0.5) and sum(adv.counts) == 4


def test_later_shard_maps_to_its_rollout_worker_and_plans_without_advantages_record_none() -> None:
    shards, results = step_of_three_groups()
    plan = StepPlan(shard_rows=[4, 2], rank_rows=[torch.arange(6)], response_width=2, metrics={})  # e.g. PPO's
    recorded = sample_traces(TraceRequest(step=1, prompts=3, rollout_workers=2), shards, results, plan, CharDecoder())
    last = recorded.samples[-1]
    assert (last.inputs.group, last.rank, last.timing["generate_s"]) == (2, 1, 2.5)
    assert (last.outputs.reward, last.outputs.reward_state, last.outputs.reward_reason) == (None, "abstain", "abstained")
    assert all(s.outputs.advantage is None for s in recorded.samples) and "advantage" not in recorded.histograms


def test_histogram_has_a_fixed_size_whatever_the_batch() -> None:
    small, large = Histogram.of(torch.rand(8), bins=10), Histogram.of(torch.rand(100_000), bins=10)
    assert small and large and len(small.counts) == len(large.counts) == 10 and len(large.edges) == 11
    assert sum(large.counts) == 100_000
    same = Histogram.of(torch.full((5,), 0.7))
    assert same and same.counts == [5.0] and same.edges[0] < 0.7 < same.edges[1]
    assert Histogram.of(torch.zeros(0)) is None


def test_weighted_sum_components_reach_the_result_through_the_real_runner() -> None:
    reward = REWARDS.build({"name": "weighted_sum", "components": [{"name": "math"}, {"name": "math", "which": "last"}],
                            "weights": [1.0, 0.5]})
    samples = [RewardSample("1+1=", "2 then 3", {"answer": "2"}), RewardSample("1+1=", "no number", {})]
    result = score_samples(reward, samples, RewardRunConfig())
    assert result.values_B.tolist() == [1.0, 0.0]
    assert result.components[0] == {"math": 1.0, "math#2": 0.0}
    # The second sample has no reference answer: both components abstain, so does the sum (no parts recorded).
    assert result.status_B[1] == RewardStatus.ABSTAIN and result.components[1] == {}
    both = RewardResult.concat([result, RewardResult(torch.zeros(1), torch.zeros(1, dtype=torch.long), [""])])
    assert both.components == [{"math": 1.0, "math#2": 0.0}, {}, {}]
    assert both.select(torch.tensor([0])).components == [{"math": 1.0, "math#2": 0.0}]


class RecordingLearner(FakeLearner):
    """A fake rank whose plan records: it answers `samples` with a `StepSamples` naming the trace's step."""

    def plan(self, batches: list[dict[str, int]], rewards: list[RewardResult], keep: list[int] | None,
             trace: TraceRequest | None = None) -> dict[str, Any]:
        return {"shards": len(batches), "trace": trace}

    def update_planned(self, plan: dict[str, Any], batches: list[dict[str, int]]) -> dict[str, float]:
        return super().update_planned({"shards": plan["shards"]}, batches)

    def samples(self, plan: dict[str, Any] | None = None) -> StepSamples | None:
        trace = (plan if plan is not None else self.last_plan or {}).get("trace")
        return None if trace is None else StepSamples(trace.step, [], {})


@pytest.mark.parametrize("ranks", [1, 2])  # one rank plans and updates in one call, and keeps the plan
def test_loop_records_every_n_steps_from_the_first(tmp_path: Path, ranks: int) -> None:
    learners = [RecordingLearner(r) for r in range(ranks)]
    trainer, rec, _ = make_trainer(tmp_path, learners, total_steps=7, log_samples_every=3, log_samples=2)
    trainer.fit()
    recorded = [(p["step"], p["samples"].step) for e, p in rec.events if e is Event.SAMPLES]
    assert recorded == [(1, 1), (4, 4), (7, 7)]
    assert trainer.trace_request(3) == TraceRequest(step=4, prompts=2, rollout_workers=2)
    trainer.cfg = trainer.cfg.model_copy(update={"log_samples_every": 0})
    assert trainer.trace_request(0) is None


def test_recorder_sees_samples_between_rollout_and_step_end(tmp_path: Path) -> None:
    trainer, rec, _ = make_trainer(tmp_path, [RecordingLearner(0)], total_steps=1, log_samples_every=1)
    trainer.fit()
    assert [e.name for e, _ in rec.events][1:4] == ["ROLLOUT_END", "SAMPLES", "STEP_END"]
