"""`toolbox.rl.plan` and the online learners' `plan`: rank 0 computes group statistics once and deals each rank
its rows; a rank fetches only the shards holding them. Several ranks are simulated in-process by patching the
learner's ``world()``; the real two-rank run is tests/integration/test_grpo_ranks.py."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest
import torch

from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.grpo.learner import GRPOLearner
from toolbox.algorithms.online_dpo.config import OnlineDPOConfig
from toolbox.algorithms.online_dpo.learner import OnlineDPOLearner
from toolbox.learner.config import LearnerConfig
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import FINISH_STOP, RolloutBatch
from toolbox.rl.plan import StepPlan

CFG = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=2)


def shard(first_row: int, rows: int, width: int, group_size: int = 2) -> RolloutBatch:
    """``rows`` rows numbered from ``first_row`` (``prompt_ids_BP[:, 0]`` holds the global row number)."""
    numbers = torch.arange(first_row, first_row + rows)
    gen = torch.Generator().manual_seed(first_row)
    return RolloutBatch(
        prompt_ids_BP=torch.stack([numbers, torch.full((rows,), 5)], 1), prompt_mask_BP=torch.ones(rows, 2, dtype=torch.long),
        response_ids_BR=torch.randint(3, 15, (rows, width), generator=gen),
        response_mask_BR=torch.ones(rows, width, dtype=torch.long), logprobs_BR=torch.zeros(rows, width),
        group_B=numbers // group_size, finish_B=torch.full((rows,), FINISH_STOP),
    )


def scores(values: list[float]) -> RewardResult:
    return RewardResult(torch.tensor(values), torch.zeros(len(values), dtype=torch.long), [""] * len(values))


def test_each_rank_fetches_only_the_shards_holding_its_rows() -> None:
    shards = [shard(0, 4, 3), shard(4, 4, 5), shard(8, 4, 2)]
    plan = StepPlan([4, 4, 4], [torch.arange(0, 6), torch.tensor([6, 7, 9, 10])], response_width=5, metrics={})
    assert [plan.shards_for(0), plan.shards_for(1)] == [[0, 1], [1, 2]]
    mine = plan.gather(1, {1: shards[1], 2: shards[2]})
    assert mine.prompt_ids_BP[:, 0].tolist() == [6, 7, 9, 10]
    with pytest.raises(ValueError, match=r"learner rank 1: the step plan needs rollout shards \[2\]"):
        plan.gather(1, {1: shards[1]})


def test_grpo_plan_on_two_ranks_deals_the_one_rank_statistics(tiny_model_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Shard 1 (the widest) holds only groups that dynamic sampling dropped: nobody fetches it, yet the
    # step's response width (Dr. GRPO's normaliser, DAPO's length limit) is still its width.
    shards = [shard(0, 4, 3), shard(4, 4, 6), shard(8, 4, 2)]
    results = [scores([1.0, 0.0, 0.0, 1.0]), scores([1.0, 1.0, 1.0, 1.0]), scores([0.0, 1.0, 1.0, 0.0])]
    learner = GRPOLearner(str(tiny_model_dir), "float32", CFG, GRPOConfig(prompts_per_step=4, group_size=2,
                                                                        advantage="reinforce_pp"), 1)
    one = learner.plan(shards, results, keep_groups=[0, 1, 4, 5])
    monkeypatch.setattr("toolbox.algorithms.grpo.learner.world", lambda: 2)
    two = learner.plan(shards, results, keep_groups=[0, 1, 4, 5])
    assert [two.shards_for(0), two.shards_for(1)] == [[0], [2]] and one.shards_for(0) == [0, 2]
    assert one.response_width == two.response_width == 6
    torch.testing.assert_close(torch.cat(two.advantages), one.advantages[0])  # batch-whitened once, over all ranks
    assert two.metrics == one.metrics and one.metrics["reward"] == pytest.approx(8 / 12)
    assert two.gather(1, {2: shards[2]}).response_ids_BR.shape[1] == 2


def test_grpo_update_normalises_by_the_plan_width_not_the_rank_width(tiny_model_dir: Path) -> None:
    shards = [shard(0, 4, 3)]
    shards[0].response_mask_BR = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])  # unequal lengths
    algo = GRPOConfig(prompts_per_step=2, group_size=2, advantage="group_mean",
                      loss={"agg": "seq-mean-token-sum-norm"})
    results = [scores([1.0, 0.0, 0.0, 3.0])]
    losses = []
    for widen in (1, 2):
        torch.manual_seed(0)
        learner = GRPOLearner(str(tiny_model_dir), "float32", CFG, algo, 1)
        plan = learner.plan(shards, results)
        plan = dataclasses.replace(plan, response_width=plan.response_width * widen)
        losses.append(learner.update(plan, {0: shards[0]})["pg_loss"])
    assert losses[0] != 0 and losses[1] == pytest.approx(losses[0] / 2, rel=1e-6)


def test_online_dpo_plan_pairs_whole_groups_per_rank(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards = [shard(0, 4, 3), shard(4, 4, 3)]
    results = [scores([0.0, 1.0, 2.0, 2.0]), scores([5.0, 1.0, 0.0, 3.0])]
    learner = OnlineDPOLearner(str(tiny_model_dir), "float32", CFG, OnlineDPOConfig(prompts_per_step=4, group_size=2), 1)
    monkeypatch.setattr("toolbox.algorithms.online_dpo.learner.world", lambda: 2)
    plan = learner.plan(shards, results)
    assert plan.pairs == 3.0  # group 1 is tied
    # Positions within each rank's own rows: rank 1 holds global rows 4..7.
    assert [plan.chosen[1].tolist(), plan.rejected[1].tolist(), plan.weight[1].tolist()] == [[0, 3], [1, 2], [1.0, 1.0]]
    assert plan.weight[0].tolist() == [1.0, 0.0] and plan.shards_for(1) == [1]
    monkeypatch.setattr("toolbox.algorithms.online_dpo.learner.world", lambda: 8)
    with pytest.raises(ValueError, match="a step of 8 rows does not split over 8 learner ranks into whole groups of 2"):
        learner.plan(shards, results)


class RecordingLearner:
    """Stands in for an online learner (`toolbox.learner.ranks.PolicyLearner`): remembers which shards `update` was
    handed."""

    def __init__(self) -> None:
        self.got: dict[int, RolloutBatch] = {}
        self.policy = types.SimpleNamespace(cfg=LearnerConfig())

    def plan(self, shards: list[RolloutBatch], results: list[RewardResult], keep_groups: list[int] | None = None) -> StepPlan:
        raise NotImplementedError("rank 1 is handed rank 0's plan")

    def update(self, plan: StepPlan, shards: dict[int, RolloutBatch]) -> dict[str, float]:
        self.got = shards
        return dict(plan.metrics)


def test_learner_worker_hands_a_rank_only_the_shards_its_rows_are_in() -> None:
    from toolbox.actors.learner import LearnerWorker

    learner = RecordingLearner()
    worker = LearnerWorker(rank=1, world_size=2, build=lambda: learner, distributed=False)
    worker.setup("127.0.0.1", 0, 10.0)
    shards = [shard(0, 4, 3), shard(4, 4, 5), shard(8, 4, 2)]
    plan = StepPlan([4, 4, 4], [torch.arange(0, 6), torch.arange(6, 12)], response_width=5, metrics={"reward": 1.0})
    metrics = worker.update_planned(plan, shards)
    assert metrics["reward"] == 1.0 and metrics["train_s"] >= 0.0  # the learner's metrics, plus its own timing
    assert sorted(learner.got) == [1, 2] and learner.got[2] is shards[2]


@pytest.mark.parametrize("traces", [True, False])
def test_rank_0_of_a_run_that_records_samples_loads_its_tokenizer_from_setup_on(tiny_model_dir: Path,
                                                                                  traces: bool) -> None:
    """With ``traces`` the tokenizer is loaded by `setup` (the first step's `plan` finds it loaded); without, it
    loads when a step first asks for samples. Either way `plan` decodes with the same one."""
    from toolbox.actors.learner import LearnerWorker

    learner = RecordingLearner()
    learner.policy.source = str(tiny_model_dir)
    worker = LearnerWorker(rank=0, world_size=1, build=lambda: learner, distributed=False, traces=traces)
    worker.setup("127.0.0.1", 0, 10.0)
    assert (worker.tokenizer is not None) == traces
    tokenizer = worker._tokenizer()
    assert worker._tokenizer() is tokenizer and tokenizer.decode(tokenizer.encode("12+34=")) == "12+34="
