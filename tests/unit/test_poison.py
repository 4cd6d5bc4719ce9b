"""Rewards cannot poison training: bad values are per-sample errors, errored samples move nothing, too many fail.

No Ray: the runner, the advantage math, `read_step` and the GRPO learner's plan/update run in-process.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.grpo.learner import GRPOLearner
from toolbox.learner.config import LearnerConfig
from toolbox.rewards import REWARDS, RewardResult, RewardSample, RewardStatus
from toolbox.rewards.base import RewardErrorRateExceeded, reward_value
from toolbox.rewards.runner import RewardRunConfig, score_samples
from toolbox.rl.advantages import batch_normalized, group_normalized, grpo_advantages, rloo
from toolbox.rl.batch import FINISH_STOP, RolloutBatch
from toolbox.rl.plan import read_step
from toolbox.rl.sampling import informative_groups

OK, ABSTAIN, ERROR = int(RewardStatus.OK), int(RewardStatus.ABSTAIN), int(RewardStatus.ERROR)


def sample(response: str) -> RewardSample:
    return RewardSample("p", response, {"answer": "1"})


# ---- bad values become per-sample errors ---------------------------------------------------------------------
BAD_VALUES = {"nan": float("nan"), "inf": float("inf"), "-inf": -math.inf, "text": "0.5", "list": [1.0],
              "vector": torch.tensor([1.0, 2.0]), "dict": {"r": 1}}
GOOD_VALUES = {"float": 0.25, "int": 1, "bool": True, "np32": np.float32(0.5), "tensor0d": torch.tensor(0.75)}


def test_bad_reward_values_are_errors_of_their_own_sample_only() -> None:
    values = {**BAD_VALUES, **GOOD_VALUES}
    result = score_samples(lambda s: values[s.response], [sample(k) for k in values], RewardRunConfig())
    by_name = dict(zip(values, zip(result.status_B.tolist(), result.values_B.tolist(), result.reasons)))
    for name in BAD_VALUES:
        status, value, reason = by_name[name]
        assert status == ERROR and value == 0.0, name
    assert by_name["nan"][2] == "ValueError: non-finite reward nan"
    assert by_name["-inf"][2] == "ValueError: non-finite reward -inf"
    assert by_name["text"][2].startswith("ValueError: non-numeric reward '0.5' (str); return a float, or None")
    assert by_name["vector"][2].startswith("ValueError: non-numeric reward tensor([1., 2.]) (Tensor)")
    assert [by_name[k][:2] for k in GOOD_VALUES] == [(OK, 0.25), (OK, 1.0), (OK, 1.0), (OK, 0.5), (OK, 0.75)]
    assert torch.isfinite(result.values_B).all()


def test_reward_value_passes_real_numbers() -> None:
    assert reward_value(np.int64(3)) == 3.0 and reward_value(torch.tensor(2)) == 2.0
    with pytest.raises(ValueError, match="non-numeric reward None"):
        reward_value(None)


def test_weighted_sum_names_the_component_that_returned_nan() -> None:
    nan_reward = "test_poison_nan"
    REWARDS.register(nan_reward)(lambda: lambda s: float("nan"))
    try:
        reward = REWARDS.build({"name": "weighted_sum", "weights": [1.0, 0.5],
                                "components": [{"name": "exact_match"}, {"name": nan_reward}]})
        result = score_samples(reward, [sample("1")], RewardRunConfig())
    finally:
        REWARDS.unregister(nan_reward)
    assert result.status_B.tolist() == [ERROR]
    assert result.reasons == [f"ValueError: weighted_sum component 1 ({nan_reward}): non-finite reward nan"]


# ---- group statistics ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0.7, 0.1, 1e6 + 0.3, -2.9])
@pytest.mark.parametrize("fn", [group_normalized, rloo, batch_normalized,
                                lambda r, v=None: group_normalized(r, v, scale=False)])
def test_equal_rewards_within_float_noise_get_exactly_zero(fn, value: float) -> None:  # noqa: ANN001
    rewards = torch.full((2, 8), value)
    rewards[1, 3] = torch.nextafter(torch.tensor(value), torch.tensor(math.inf))  # one ulp apart: still equal
    assert fn(rewards).abs().max().item() == 0.0


def test_dynamic_sampling_uses_the_same_notion_of_equal() -> None:
    values = torch.tensor([1e6 + 0.3, 1e6 + 0.3, 1e6 + 0.3 + 0.0625, 0.0, 1.0, 5.0])  # 0.0625: one float32 ulp
    ok, group = torch.tensor([True] * 5 + [False]), torch.tensor([0, 0, 0, 1, 1, 1])
    assert informative_groups(values, ok, group) == {0: False, 1: True}
    assert informative_groups(values, torch.tensor([True] * 3 + [False, True, True]), group) == {0: False, 1: True}


def test_errored_samples_leave_group_statistics_alone() -> None:
    rewards = torch.tensor([[1.0, 0.0, 123.0, 0.0], [5.0, -9.0, 9.0, 0.0]])
    valid = torch.tensor([[True, True, False, True], [False, False, True, False]])
    adv, used = grpo_advantages(rewards.reshape(-1), 4, "group_norm", valid.reshape(-1))
    # Group 0 is normalised as if the errored sample were not there; group 1 has one scored sample: no baseline.
    expected = group_normalized(torch.tensor([[1.0, 0.0, 0.0]]))[0]
    torch.testing.assert_close(adv[[0, 1, 3]], expected)
    assert adv[2] == 0.0 and adv[4:].abs().max() == 0.0
    assert used.tolist() == [True, True, False, True, False, False, False, False]
    adv_rloo, _ = grpo_advantages(rewards.reshape(-1), 4, "rloo", valid.reshape(-1))
    torch.testing.assert_close(adv_rloo[[0, 1, 3]], torch.tensor([1.0, -0.5, -0.5]))
    whitened, _ = grpo_advantages(rewards.reshape(-1), 4, "reinforce_pp", valid.reshape(-1))
    torch.testing.assert_close(whitened[[0, 1, 3]], batch_normalized(torch.tensor([[1.0, 0.0, 0.0]]))[0])
    assert whitened[[2, 4, 5, 6, 7]].abs().max() == 0.0


# ---- the step: error rate, metrics, the learner --------------------------------------------------------------
def batch(lengths: list[int], width: int = 3) -> RolloutBatch:
    rows = len(lengths)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return RolloutBatch(
        prompt_ids_BP=torch.full((rows, 2), 5), prompt_mask_BP=torch.ones(rows, 2, dtype=torch.long),
        response_ids_BR=torch.randint(3, 15, (rows, width), generator=torch.Generator().manual_seed(0)),
        response_mask_BR=mask, logprobs_BR=torch.zeros(rows, width), group_B=torch.arange(rows) // 4,
        finish_B=torch.full((rows,), FINISH_STOP),
    )


def result(values: list[float], errors: dict[int, str], max_error_rate: float = 0.5) -> RewardResult:
    status = torch.tensor([ERROR if i in errors else OK for i in range(len(values))])
    return RewardResult(torch.tensor(values) * (status == OK), status, [errors.get(i, "") for i in range(len(values))],
                        max_error_rate=max_error_rate)


def test_a_step_over_max_error_rate_fails_naming_the_most_common_reasons() -> None:
    shards = [batch([1] * 4), batch([1] * 4)]
    timeout, crash = "timed out after 10.0s", "ZeroDivisionError: division by zero"
    read_step(shards, [result([1.0] * 4, {0: crash, 1: crash}), result([1.0] * 4, {0: timeout, 1: crash})], None)
    too_many = [result([1.0] * 4, {0: crash, 1: crash, 2: timeout}), result([1.0] * 4, {0: timeout, 1: crash})]
    with pytest.raises(RewardErrorRateExceeded, match=(
            r"5 of 8 samples errored \(62%\), above reward.run.max_error_rate=0.5; most common reasons: "
            rf"3x {crash}; 2x {timeout}\. Fix the reward")):
        read_step(shards, too_many, None)


def test_step_metrics_count_errors_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    errors = {0: "ValueError: non-finite reward nan", 1: "ValueError: non-finite reward nan", 2: "KeyError: 'x'"}
    step = read_step([batch([1] * 4)], [result([0.0, 0.0, 0.0, 1.0], errors, max_error_rate=1.0)], None)
    assert step.metrics["reward_error_rate"] == 0.75 and step.metrics["reward_error"] == 3.0
    assert step.metrics["reward_error/ValueError: non-finite reward nan"] == 2.0
    assert step.metrics["reward_error/KeyError: 'x'"] == 1.0
    assert "reward errors in 3 of 4 samples: 2x ValueError: non-finite reward nan; 1x KeyError: 'x'" in caplog.text


def test_a_reward_that_always_raises_cannot_finish_a_run() -> None:
    def broken(s: RewardSample) -> float:
        raise KeyError("answer")

    scored = score_samples(broken, [sample("x")] * 4, RewardRunConfig())  # default max_error_rate 0.5
    with pytest.raises(RewardErrorRateExceeded, match="4 of 4 samples errored.*4x KeyError: 'answer'"):
        read_step([batch([1] * 4)], [scored], None)


def test_grpo_errored_sample_is_out_of_the_loss_and_its_normaliser(tiny_model_dir: Path) -> None:
    # One group of 4, lengths 1, 2, 3, 3; sample 2 errored. group_mean over the scored (1, 0, 0): mean 1/3,
    # advantages (2/3, -1/3, -, -1/3). seq-mean-token-sum, on policy (ratio 1): per sequence -adv * length
    # = (-2/3, 2/3, -, 1); their sum 1 over 3 sequences (4 before: the errored row counted) is 1/3.
    algo = GRPOConfig(prompts_per_step=1, group_size=4, advantage="group_mean",
                      loss={"agg": "seq-mean-token-sum"})
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=2)
    shard = batch([1, 2, 3, 3])
    rewards = result([1.0, 0.0, 77.0, 0.0], {2: "RuntimeError: boom"}, max_error_rate=0.5)
    learner = GRPOLearner(str(tiny_model_dir), "float32", cfg, algo, 1)
    plan = learner.plan([shard], [rewards])
    assert plan.valid[0].tolist() == [True, True, False, True]
    torch.testing.assert_close(plan.advantages[0], torch.tensor([2 / 3, -1 / 3, 0.0, -1 / 3]))
    assert learner.update(plan, {0: shard})["pg_loss"] == pytest.approx(1 / 3, rel=1e-5)
