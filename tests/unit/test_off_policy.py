"""Overlap of generation and training (``rollout.max_staleness``) without Ray: the truncated-importance-sampling
maths by hand, the config rules, and the order in which the loop drives (recording) rollout workers."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from toolbox.actors.group import LocalGroup
from toolbox.actors.roles import PolicyLearnerGroup, RewardGroup, RolloutGroup

from tests.unit.test_trainer import ALGO, CharTokenizer, FakeLearner, FakeReward, FakeRollout
from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.config import load_config
from toolbox.config.schema import ExperimentConfig
from toolbox.config.trainer import TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.core.events import EventBus
from toolbox.data.prompts import PromptSource
from toolbox.data.tasks import TASKS
from toolbox.engines.base import SamplingConfig
from toolbox.objectives.grpo import grpo_loss
from toolbox.objectives.policy import off_policy_correction, truncated_importance_weights
from toolbox.rl.batch import PromptRequest
from toolbox.trainers.measures import role_shares
from toolbox.trainers.online import OnlineTrainer

# test_grpo's hand case: per-token clipped loss [[-1.3, -0.5, (masked)], [1.5, 0.8, 1.2]], 5 tokens in the mask.
OLD_BT = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]])
LOGP_BT = OLD_BT + torch.tensor([[1.5, 0.5, 1.0], [1.5, 0.5, 1.2]]).log()
ADV_B = torch.tensor([1.0, -1.0])
MASK_BT = torch.tensor([[1, 1, 0], [1, 1, 1]])
# pi_old / pi_behaviour per token; with cap 2 the weights are [[0.5, 2, 1], [1, 1.5, 2]], capped at (0,1), (1,2).
RATIO_BT = torch.tensor([[0.5, 4.0, 1.0], [1.0, 1.5, 3.0]])
BEHAVIOUR_BT = OLD_BT - RATIO_BT.log()


def test_weights_are_the_ratio_truncated_at_the_cap() -> None:
    weights, capped = truncated_importance_weights(OLD_BT, BEHAVIOUR_BT, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 2.0, 1.0], [1.0, 1.5, 2.0]]))
    torch.testing.assert_close(capped, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    huge, _ = truncated_importance_weights(torch.zeros(1, 1), torch.full((1, 1), -1e4), cap=2.0)
    assert huge.item() == pytest.approx(2.0)  # exp(1e4) is never formed


def test_grpo_loss_weights_each_token_and_reports_the_gap() -> None:
    terms = grpo_loss(LOGP_BT, OLD_BT, None, ADV_B, MASK_BT, 5, 2, 3, clip_low=0.2, clip_high=0.3,
                      behaviour_logp_BT=BEHAVIOUR_BT, tis_cap=2.0)
    # [[-1.3 * 0.5, -0.5 * 2], [1.5 * 1, 0.8 * 1.5, 1.2 * 2]] over 5 tokens
    assert terms.pg_loss == pytest.approx((-0.65 - 1.0 + 1.5 + 1.2 + 2.4) / 5)
    assert terms.clip_frac == pytest.approx(2 / 5)  # the PPO clip is unchanged by the weights
    assert terms.off_policy["tis_frac"] == pytest.approx(2 / 5)
    # k3 of KL(behaviour || old) per token: r - log r - 1 with r = pi_old / pi_behaviour
    k3 = [r - math.log(r) - 1 for r in (0.5, 4.0, 1.0, 1.5, 3.0)]
    assert terms.off_policy["behaviour_kl"] == pytest.approx(sum(k3) / 5)


def test_cap_zero_leaves_the_loss_as_it_was() -> None:
    plain = grpo_loss(LOGP_BT, OLD_BT, None, ADV_B, MASK_BT, 5, 2, 3, clip_low=0.2, clip_high=0.3)
    off = grpo_loss(LOGP_BT, OLD_BT, None, ADV_B, MASK_BT, 5, 2, 3, clip_low=0.2, clip_high=0.3,
                    behaviour_logp_BT=BEHAVIOUR_BT, tis_cap=0.0)
    assert plain.loss.item() == off.loss.item() == pytest.approx(1.7 / 5)
    assert plain.off_policy == {} and off.off_policy["tis_frac"] == 0.0 and off.off_policy["behaviour_kl"] > 0


def test_gradient_is_the_weighted_gradient() -> None:
    """The weight is a constant of the loss: d(loss)/d(logp) is the unweighted gradient times the weight."""
    grads = []
    for cap in (0.0, 2.0):
        logp = LOGP_BT.clone().requires_grad_()
        grpo_loss(logp, OLD_BT, None, ADV_B, MASK_BT, 5, 2, 3, clip_low=0.2, clip_high=0.3,
                  behaviour_logp_BT=BEHAVIOUR_BT, tis_cap=cap).loss.backward()
        grads.append(logp.grad)
    weights, _ = truncated_importance_weights(OLD_BT, BEHAVIOUR_BT, 2.0)
    torch.testing.assert_close(grads[1], grads[0] * weights)
    assert grads[0].abs().sum() > 0


def test_micro_batches_add_up_to_the_whole() -> None:
    """Metrics are normalised by the mini-batch's token count, so the micro-batches' values add up to its value."""
    pg_BT = torch.ones(2, 3)
    _, whole = off_policy_correction(pg_BT, OLD_BT, BEHAVIOUR_BT, 2.0, MASK_BT, token_count=5)
    parts = [off_policy_correction(pg_BT[i:i + 1], OLD_BT[i:i + 1], BEHAVIOUR_BT[i:i + 1], 2.0, MASK_BT[i:i + 1], 5)[1]
             for i in range(2)]
    for key, value in whole.items():
        assert sum(p[key] for p in parts) == pytest.approx(value)


@pytest.mark.parametrize(("overrides", "cap"), [
    (["experiment=grpo_tiny_fsdp2"], 0.0),  # synchronous: no correction, the loss as before
    ([], 2.0),  # grpo_tiny samples ahead
    (["experiment=grpo_tiny_fsdp2", "rollout.max_staleness=1"], 2.0),
    (["experiment=grpo_tiny_fsdp2", "rollout.max_staleness=1", "algorithm.tis_cap=5"], 5.0),
    (["experiment=grpo_tiny_fsdp2", "rollout.max_staleness=2", "algorithm.tis_cap=0"], 0.0),
    (["experiment=ppo_tiny", "rollout.max_staleness=1"], 2.0),
])
def test_unset_cap_follows_max_staleness(overrides: list[str], cap: float) -> None:
    assert load_config(overrides).algorithm.tis_cap == cap  # type: ignore[attr-defined]


def test_config_errors_name_the_fields() -> None:
    with pytest.raises(ConfigError, match="rollout.max_staleness=1 samples while the learner trains; "
                                          "rollout.placement: colocate"):
        ExperimentConfig(rollout={"placement": "colocate", "num_workers": 2, "max_staleness": 1})
    with pytest.raises(ConfigError, match=r"rollout.max_staleness: Input should be greater than or equal to 0 \(got -1\)"):
        load_config(["rollout.max_staleness=-1"])


class LoggingRollout(FakeRollout):
    """Logs each call in the order it runs (in-process: the order the loop submits, as a Ray actor runs them)."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log, self.shards = log, []

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> dict[str, int]:
        self.log.append("generate")
        self.shards.append([r.ids for r in requests])
        return super().generate(requests, sampling)

    def generate_steps(self, requests_per_step: list[list[PromptRequest]],
                       sampling: SamplingConfig) -> tuple[dict[str, int], ...]:
        self.log.append(f"generate x{len(requests_per_step)}")
        self.shards.extend([r.ids for r in requests] for requests in requests_per_step)
        return tuple(FakeRollout.generate(self, requests, sampling) for requests in requests_per_step)

    def update_weights(self, bucket_refs: list[Any]) -> float:
        self.log.append(f"load {bucket_refs[0]}")
        return super().update_weights(bucket_refs)


def make(tmp_path: Path, staleness: int, algo: GRPOConfig = ALGO, steps: int = 3,
         per_generation: int = 1) -> tuple[OnlineTrainer, list[str], LoggingRollout]:
    log: list[str] = []
    worker = LoggingRollout(log)  # one rollout worker: the log is its queue
    prompts = PromptSource(TASKS.build({"name": "digit_add"}), CharTokenizer(), seed=0)
    # no final evaluation: the log holds the loop's own generate calls only
    cfg = TrainerConfig(total_steps=steps, save_every=0, log_samples_every=0, final_eval=False)
    trainer = OnlineTrainer(cfg, EventBus(), algo, SamplingConfig(), prompts, RolloutGroup(LocalGroup("rollout", [worker])),
                            RewardGroup(LocalGroup("reward", [FakeReward()])),
                            PolicyLearnerGroup(LocalGroup("learner", [FakeLearner(0)])), tmp_path,
                            dynamic=algo, max_staleness=staleness, steps_per_generation=per_generation)
    return trainer, log, worker


def test_synchronous_loop_samples_each_step_with_the_last_weights(tmp_path: Path) -> None:
    trainer, log, _ = make(tmp_path, 0)
    trainer.fit()
    assert log == ["load weights-after-0", "generate", "load weights-after-1", "generate", "load weights-after-2",
                   "generate", "load weights-after-3"]
    assert [m["staleness"] for m in trainer.history] == [0.0, 0.0, 0.0]


def test_one_step_ahead_samples_before_the_sync_lands(tmp_path: Path) -> None:
    trainer, log, worker = make(tmp_path, 1)
    trainer.fit()
    # Step 0 samples step 1 before its own sync: step 1's batch comes from the weights before step 0's update.
    # Nothing is sampled after step 1's update (step 2 is in flight, the last): its sync is skipped.
    assert log == ["load weights-after-0", "generate", "generate", "load weights-after-1", "generate",
                   "load weights-after-3"]
    assert [m["staleness"] for m in trainer.history] == [0.0, 1.0, 1.0]
    synchronous, _, sync_worker = make(tmp_path, 0)
    synchronous.fit()
    assert worker.shards == sync_worker.shards  # the same prompts, in the same order
    assert not trainer.loads  # the last loads were waited for at the end


@pytest.mark.parametrize(("staleness", "log", "lags"), [
    # Blocks {0, 1} and {2, 3} each sampled by one call; block {2, 3} waits until step 3 is within reach (step 1);
    # the run's last block is step 4 alone, within reach at step 2. No sync after steps 3 and 4's updates until the
    # last (nothing samples with them).
    (2, ["load weights-after-0", "generate x2", "load weights-after-1", "generate x2", "load weights-after-2",
         "generate", "load weights-after-5"], [0, 1, 1, 2, 2]),
    # max_staleness = g - 1: a block of two is sampled when its first step runs (as TRL's steps_per_generation);
    # the lone last step may still be sampled one step ahead. Steps 1 and 3 sample nothing: their syncs are skipped.
    (1, ["load weights-after-0", "generate x2", "load weights-after-2", "generate x2",
         "load weights-after-3", "generate", "load weights-after-5"], [0, 1, 0, 1, 1]),
])
def test_blocks_of_steps_sample_in_one_call(tmp_path: Path, staleness: int, log: list[str], lags: list[int]) -> None:
    trainer, calls, worker = make(tmp_path, staleness, steps=5, per_generation=2)
    trainer.fit()
    assert calls == log
    assert [m["staleness"] for m in trainer.history] == lags
    assert max(lags) <= staleness
    one_by_one, _, sync_worker = make(tmp_path, 0, steps=5)
    one_by_one.fit()
    assert worker.shards == sync_worker.shards  # each step still trains on its own prompts, in order


def test_blocks_need_the_staleness_they_cause() -> None:
    with pytest.raises(ConfigError, match=r"rollout.steps_per_generation=3: the last step of a block trains on "
                                          r"samples 2 policy versions old, rollout.max_staleness=1 allows 1"):
        ExperimentConfig(rollout={"steps_per_generation": 3, "max_staleness": 1})
    with pytest.raises(ConfigError, match="steps_per_generation=2 with algorithm.dynamic_sampling"):
        load_config(["experiment=dapo_tiny", "rollout.steps_per_generation=2", "rollout.max_staleness=2"])
    assert load_config(["rollout.steps_per_generation=2", "rollout.max_staleness=1"]).rollout.steps_per_generation == 2


def test_dynamic_sampling_adds_rounds_when_the_step_runs(tmp_path: Path) -> None:
    """DAPO: the first round of step 1 is sampled ahead; its extra rounds (FakeReward's groups never inform) are
    sampled when step 1 runs, after the weights of step 0's update loaded, and before step 2's first round."""
    trainer, log, _ = make(tmp_path, 1, GRPOConfig(prompts_per_step=2, group_size=3, dynamic_sampling=True,
                                                   max_sampling_rounds=2), steps=2)
    trainer.fit()
    assert log == ["load weights-after-0", "generate", "generate", "generate", "load weights-after-1",
                   "generate", "load weights-after-2"]
    assert [m["sampling_rounds"] for m in trainer.history] == [2.0, 2.0]


def test_a_restart_drops_the_rounds_in_flight(tmp_path: Path) -> None:
    """`prepare` (which a restarted learner group comes back through) samples the steps in flight again."""
    trainer, log, _ = make(tmp_path, 2, steps=4)
    trainer.prepare()
    trainer.run_step(0)  # step 1's calls went out before step 0's wait, and sampled step 3 ahead
    assert list(trainer.submitted) == [1] and sorted(trainer.ahead) == [2, 3] and trainer.version == 1
    trainer.prepare()
    assert not trainer.ahead and not trainer.submitted and not trainer.loads and trainer.version == 0


class LoggingLearner(FakeLearner):
    """Logs its updates and exports into the rollout worker's log: one order for both roles' calls."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(0)
        self.log = log

    def update_planned(self, plan: dict[str, Any], batches: list[dict[str, int]]) -> dict[str, float]:
        self.log.append("update")
        return super().update_planned(plan, batches)

    def export_weights(self) -> list[Any]:
        self.log.append("export")
        return super().export_weights()


def recorded(decide: Any, answers: list[bool], step: int) -> bool:
    answers.append(decide(step))
    return answers[-1]


@pytest.mark.parametrize("staleness", [0, 2])
def test_the_next_step_goes_out_early_in_the_same_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        staleness: int) -> None:
    """Submitting step t + 1's calls before step t's wait changes neither the calls nor their order (so no number);
    it is not done before an evaluation, a checkpoint or the run's end."""
    logs, early = [], []
    for submits_early in (True, False):
        trainer, log, _ = make(tmp_path, staleness, steps=7, per_generation=1 + (staleness > 0))
        trainer.cfg = trainer.cfg.model_copy(update={"eval_every": 3, "save_every": 5})
        trainer.learner = PolicyLearnerGroup(LocalGroup("learner", [LoggingLearner(log)]))
        trainer.evaluate = lambda: {}  # type: ignore[method-assign]  # the fake reward scores no greedy set
        if not submits_early:
            monkeypatch.setattr(trainer, "_submits_next", lambda step: False)
        else:
            monkeypatch.setattr(trainer, "_submits_next", partial(recorded, trainer._submits_next, early))
        trainer.fit()
        logs.append(log)
    assert logs[0] == logs[1] and logs[0].count("update") == 7
    # the loop counts steps from 1: evaluations after steps 3 and 6, a checkpoint after 5, the run ends after 7
    assert early == [True, True, False, True, False, False, False]


def test_idle_shares_by_hand() -> None:
    shares = role_shares({"driver_wait_s": 2.0, "generate_s": 1.0, "sync_s": 0.5, "train_s": 1.5}, 1)
    assert shares == {"staleness": 1.0, "rollout_idle": 0.25, "learner_idle": 0.25}
    assert role_shares({"driver_wait_s": 1.0, "train_s": 3.0}, 0) == {"staleness": 0.0, "learner_idle": 0.0}
