"""The one retry policy's count reaches the step metrics: each retry is handed out once (`take_retries`), a worker's
ride with the batch or scores it returns, and the driver adds its own, so a step's ``retries`` counts every process's
retries once, in-process groups included."""

from __future__ import annotations

import pickle

import torch
from toolbox.actors.rollout import split_rows

from toolbox.config.trainer import TrainerConfig
from toolbox.core.events import EventBus
from toolbox.core.retry import RetryPolicy, take_retries, transient
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.plan import phase_seconds
from toolbox.trainers.base import BaseTrainer


def retried(times: int) -> None:
    """A call through the policy that fails ``times`` times with a transient error, then succeeds."""
    left = [times]

    def flaky() -> None:
        if left[0]:
            left[0] -= 1
            raise ConnectionResetError("reset by peer")

    RetryPolicy(attempts=times + 1, first_pause_s=0.0).call(flaky, what="t retried", retryable=transient,
                                                            sleep=lambda s: None)


def batch(rows: int, retries: int = 0) -> RolloutBatch:
    ones = torch.ones(rows, 2, dtype=torch.long)
    return RolloutBatch(ones, ones, ones, ones, torch.zeros(rows, 2), torch.arange(rows), torch.zeros(rows,
                        dtype=torch.long), retries=retries)


def test_each_retry_is_handed_out_once() -> None:
    take_retries()
    retried(2)
    assert take_retries() == 2 and take_retries() == 0


def test_batches_and_scores_carry_their_workers_retries_into_the_step() -> None:
    assert RolloutBatch.concat([batch(2, 1), batch(3, 2)]).retries == 3
    assert pickle.loads(pickle.dumps(batch(2, 3))).retries == 3  # as Ray hands it from the worker to the learner
    take_retries()
    retried(1)
    parts = split_rows(batch(4), [1, 3], seconds=2.0)  # one engine call for two steps: the first carries its retries
    assert [p.retries for p in parts] == [1, 0]
    scores = RewardResult(torch.zeros(2), torch.zeros(2, dtype=torch.long), ["", ""], retries=4)
    assert RewardResult.concat([scores, scores]).retries == 8 and pickle.loads(pickle.dumps(scores)).retries == 4
    assert phase_seconds([batch(2, 1), batch(2)], [scores])["retries"] == 5
    assert "retries" not in phase_seconds([batch(2)], [])


class RetryingTrainer(BaseTrainer):
    """Steps whose workers retried twice (the plan's ``retries``) while this process retried once (storage)."""

    def train_step(self, step: int) -> dict[str, float]:
        retried(1)
        return {"reward": 0.0, "retries": 2.0}

    def save(self, step: int) -> str:
        return ""


def test_a_steps_retries_are_its_workers_and_the_drivers() -> None:
    retried(5)  # before the run: not its own
    trainer = RetryingTrainer(TrainerConfig(total_steps=2, final_eval=False), EventBus(), "x")
    summary = trainer.fit()
    assert [m["retries"] for m in trainer.history] == [3.0, 3.0] and summary["retries"] == 6.0
