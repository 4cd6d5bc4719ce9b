"""`toolbox.rewards`: verifiable rewards, the weighted sum, and the three-state runner."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from toolbox.core.errors import ConfigError
from toolbox.models.tiny import build_char_tokenizer
from toolbox.rewards import REWARDS, RewardResult, RewardSample, RewardStatus
from toolbox.rewards.runner import RewardRunConfig, decode_samples, score_samples
from toolbox.rl.batch import RolloutBatch


def sample(response: str, answer: str | None = "7") -> RewardSample:
    return RewardSample("3+4=", response, {} if answer is None else {"answer": answer})


# ---- verifiable rewards ------------------------------------------------------------------------
def test_exact_match() -> None:
    reward = REWARDS.build({"name": "exact_match"})
    assert reward(sample("7")) == 1.0
    assert reward(sample(" 7\n")) == 1.0
    assert reward(sample("77")) == 0.0
    assert reward(sample("7", answer=None)) is None
    strict = REWARDS.build({"name": "exact_match", "strip": False})
    assert strict(sample(" 7")) == 0.0 and strict(sample("7")) == 1.0


def test_math_first_and_last() -> None:
    first = REWARDS.build({"name": "math"})
    last = REWARDS.build({"name": "math", "which": "last"})
    assert first(sample("7 then 9")) == 1.0 and last(sample("7 then 9")) == 0.0
    assert first(sample("9, no 7")) == 0.0 and last(sample("9, no 7")) == 1.0
    assert first(sample("7.0000001")) == 1.0  # within the default tolerance
    assert first(sample("-7", answer="-7")) == 1.0
    assert first(sample("no digits")) == 0.0
    assert first(sample("7", answer=None)) is None
    loose = REWARDS.build({"name": "math", "tolerance": 0.5})
    assert loose(sample("7.4")) == 1.0 and loose(sample("7.6")) == 0.0


def test_math_reads_a_gsm8k_reference_after_its_marker_and_takes_no_expression_for_an_answer() -> None:
    last = REWARDS.build({"name": "math", "which": "last"})
    reference = "12 - 9 = 3\n#### 3"
    assert last(sample("12 - 9 = 3", answer=reference)) == 1.0
    assert last(sample("#### 3", answer=reference)) == 1.0
    assert last(sample("12 - 9", answer=reference)) == 0.0  # the question restated is not its answer
    assert last(sample("12 - 9 = 4", answer=reference)) == 0.0
    unmarked = REWARDS.build({"name": "math", "which": "last", "marker": None})
    with pytest.raises(ValueError):  # without the marker the whole solution is the reference: not a number
        unmarked(sample("3", answer=reference))


def test_math_option_errors_name_the_path() -> None:
    with pytest.raises(ConfigError, match=r"reward\.spec\.which.*'first' or 'last'"):
        REWARDS.validate({"name": "math", "which": "middle"}, "reward.spec")


def test_weighted_sum() -> None:
    reward = REWARDS.build({"name": "weighted_sum", "weights": [0.5, 2.0],
                            "components": [{"name": "exact_match"}, {"name": "math", "which": "last"}]})
    assert reward(sample("7")) == pytest.approx(2.5)
    assert reward(sample("1 7")) == pytest.approx(2.0)
    assert reward(sample("1")) == 0.0
    assert reward(sample("7", answer=None)) is None  # every component abstains


def test_weighted_sum_counts_must_match() -> None:
    with pytest.raises(ValueError, match="2 components but 1 weights"):
        REWARDS.build({"name": "weighted_sum", "weights": [1.0], "components": [{"name": "math"}, {"name": "math"}]})


# ---- the runner --------------------------------------------------------------------------------
RUN = RewardRunConfig(timeout_s=5.0, threads=4)


def test_runner_three_states_and_metrics() -> None:
    def reward(s: RewardSample) -> float | None:
        if s.response == "boom":
            raise RuntimeError("checker crashed")
        if s.response == "skip":
            return None
        return float(s.response)

    result = score_samples(reward, [sample("1"), sample("boom"), sample("skip"), sample("0.5"), sample("boom")], RUN)
    assert result.status_B.tolist() == [RewardStatus.OK, RewardStatus.ERROR, RewardStatus.ABSTAIN, RewardStatus.OK,
                                        RewardStatus.ERROR]
    assert result.values_B.tolist() == [1.0, 0.0, 0.0, 0.5, 0.0]
    assert result.reasons[1] == "RuntimeError: checker crashed" and result.reasons[2] == "abstained"
    assert result.reasons[0] == ""
    assert result.ok_B.tolist() == [True, False, False, True, False]
    assert result.metrics() == {"reward": 0.75, "reward_abstain": 1.0, "reward_error": 2.0,
                                "reward_error_rate": pytest.approx(0.4),
                                "reward_error/RuntimeError: checker crashed": 2.0}


def test_runner_timeout_marks_late_samples() -> None:
    release = threading.Event()

    def reward(s: RewardSample) -> float:
        if s.response == "slow":
            release.wait(10.0)
        return 1.0

    try:
        result = score_samples(reward, [sample("fast"), sample("slow"), sample("fast")], RewardRunConfig(timeout_s=0.2, threads=3))
    finally:
        release.set()  # let the stuck thread finish instead of lingering
    assert result.status_B.tolist() == [RewardStatus.OK, RewardStatus.ERROR, RewardStatus.OK]
    assert "timed out" in result.reasons[1] and result.values_B[1].item() == 0.0
    assert result.metrics()["reward_error"] == 1.0


def test_runner_empty_and_all_errors() -> None:
    empty = score_samples(lambda s: 1.0, [], RUN)
    assert len(empty) == 0
    failed = score_samples(lambda s: 1 / 0, [sample("x")], RUN)
    assert failed.status_B.tolist() == [RewardStatus.ERROR] and "ZeroDivisionError" in failed.reasons[0]
    assert math.isnan(failed.metrics()["reward"])  # no scored sample: no mean, not a silent 0


def test_result_concat() -> None:
    a = RewardResult(torch.tensor([1.0]), torch.tensor([0]), [""])
    b = RewardResult(torch.tensor([0.0, 2.0]), torch.tensor([2, 0]), ["bad", ""])
    c = RewardResult.concat([a, b])
    assert c.values_B.tolist() == [1.0, 0.0, 2.0] and c.status_B.tolist() == [0, 2, 0] and c.reasons == ["", "bad", ""]


def test_decode_samples_uses_masks_and_extras() -> None:
    tok = build_char_tokenizer("0123456789+=")
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    pad, eos = tok.pad_token_id, tok.eos_token_id
    batch = RolloutBatch(
        prompt_ids_BP=torch.tensor([[pad, *enc("1+2=")], enc("10+2=")]),
        prompt_mask_BP=torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]),
        response_ids_BR=torch.tensor([[*enc("3"), eos, pad], enc("124")]),
        response_mask_BR=torch.tensor([[1, 1, 0], [1, 1, 1]]),
        logprobs_BR=torch.zeros(2, 3),
        group_B=torch.tensor([0, 1]),
        finish_B=torch.tensor([0, 1]),
        extras=[{"answer": "3"}, {"answer": "12"}],
    )
    samples = decode_samples(batch, tok)
    assert [(s.prompt, s.response) for s in samples] == [("1+2=", "3"), ("10+2=", "124")]
    assert samples[1].extras == {"answer": "12"}
    result = score_samples(REWARDS.build({"name": "math"}), samples, RUN)
    assert result.values_B.tolist() == [1.0, 0.0]
