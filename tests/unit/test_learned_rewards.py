"""``reward_model`` (a scalar-head model scoring in batches) and ``llm_judge`` (a fake engine: scores parsed, retries,
timeouts and failures become reward ERRORs, never 0), alone and inside ``weighted_sum`` with a rule-based reward."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import torch

from toolbox.core.errors import ConfigError
from toolbox.data.encode import encode_pair
from toolbox.data.packing import pad_examples
from toolbox.engines import ENGINES, SamplingConfig
from toolbox.engines.common import Sample, batch_from_samples
from toolbox.models.loading import load_tokenizer
from toolbox.models.reward_head import load_reward_model, sequence_scores
from toolbox.rewards import REWARDS, RewardSample, RewardStatus
from toolbox.rewards.runner import RewardRunConfig, score_samples
from toolbox.rl.batch import FINISH_STOP, PromptRequest, RolloutBatch

RUN = RewardRunConfig(timeout_s=60.0, threads=8, max_error_rate=1.0)


@pytest.fixture(scope="module")
def rm_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny causal LM with a fresh scalar head, saved as a reward model directory."""
    out = tmp_path_factory.mktemp("rm")
    load_reward_model(str(tiny_model_dir)).save_pretrained(out)
    load_tokenizer(str(tiny_model_dir)).save_pretrained(out)
    return out


def test_reward_model_scores_in_batches_like_one_at_a_time(rm_dir: Path) -> None:
    reward = REWARDS.build({"name": "reward_model", "path": str(rm_dir), "device": "cpu", "max_wait_ms": 50})
    samples = [RewardSample(f"{a}+{a}=", str(2 * a + k), {}) for a in range(6) for k in range(2)]
    result = score_samples(reward, samples, RUN)
    assert (result.status_B == RewardStatus.OK).all()
    tok, model = load_tokenizer(str(rm_dir)), load_reward_model(str(rm_dir)).eval()
    with torch.no_grad():
        alone = [float(sequence_scores(model, pad_examples([encode_pair(s.prompt, s.response, tok, True)], 0)))
                 for s in samples]
    torch.testing.assert_close(result.values_B, torch.tensor(alone), rtol=1e-5, atol=1e-5)
    assert len(set(alone)) > 1, "every sample scored the same: the scores cannot tell a mixup"
    assert max(reward.batcher.batch_sizes) > 1, "samples were never batched"  # type: ignore[attr-defined]


class FakeJudge:
    """Replies by the last character of the judge prompt: the response under the template ``{prompt}{response}``.

    '7' -> "7" (a score); '9' -> "=" (no score); '8' -> raises; '6' -> hangs past the timeout; '5' -> raises on
    its first call only (a retry succeeds).
    """

    calls: dict[str, int] = {}
    lock = threading.Lock()

    def __init__(self, model_path: str) -> None:
        self.tokenizer = load_tokenizer(model_path)

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        replies = []
        for request in requests:
            prompt = self.tokenizer.decode(request.ids, skip_special_tokens=True)
            last = prompt[-1]
            with self.lock:
                self.calls[prompt] = self.calls.get(prompt, 0) + 1
                first = self.calls[prompt] == 1
            if last == "8" or (last == "5" and first):
                raise RuntimeError("judge server answered 503")
            if last == "6":
                time.sleep(1.0)
            reply = {"7": "7", "9": "=", "5": "5", "6": "6"}[last]
            ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
            replies.append(Sample(ids, [0.0] * len(ids), FINISH_STOP))
        return batch_from_samples(requests, replies, int(self.tokenizer.pad_token_id))


@pytest.fixture
def fake_engine() -> object:
    ENGINES.register("fake_judge")(FakeJudge)
    FakeJudge.calls.clear()
    yield FakeJudge
    ENGINES.unregister("fake_judge")


def judge_spec(model_dir: Path, **options: object) -> dict:
    return {"name": "llm_judge", "model_path": str(model_dir), "engine": {"name": "fake_judge"},
            "template": "{prompt}{response}", "pattern": r"(\d+)", "retries": 1, "timeout_s": 0.3, **options}


def test_llm_judge_scores_and_failures_are_errors(tiny_model_dir: Path, fake_engine: object) -> None:
    # batch_size 1: an engine call that fails fails every prompt of its batch, so each prompt gets its own here.
    reward = REWARDS.build(judge_spec(tiny_model_dir, batch_size=1))
    samples = [RewardSample("1+6=", r, {}) for r in ("7", "9", "8", "5")]
    result = score_samples(reward, samples, RUN)
    status = [RewardStatus(s).name for s in result.status_B.tolist()]
    assert status == ["OK", "ERROR", "ERROR", "OK"]
    assert result.values_B.tolist() == pytest.approx([0.7, 0.0, 0.0, 0.5])
    assert "no score in the judge's reply '='" in result.reasons[1] and "after 2 attempt(s)" in result.reasons[1]
    assert "RuntimeError: judge server answered 503" in result.reasons[2]
    assert FakeJudge.calls["1+6=8"] == 2 and FakeJudge.calls["1+6=5"] == 2  # one retry each
    late = score_samples(reward, [RewardSample("1+6=", "6", {})], RUN)
    assert late.status_B.tolist() == [RewardStatus.ERROR] and "judge call timed out after 0.3s" in late.reasons[0]


def test_weighted_sum_reports_judge_and_rule_components(tiny_model_dir: Path, rm_dir: Path,
                                                        fake_engine: object) -> None:
    reward = REWARDS.build({"name": "weighted_sum", "weights": [1.0, 0.5, 2.0], "components": [
        {"name": "exact_match"}, judge_spec(tiny_model_dir, normalize=False),
        {"name": "reward_model", "path": str(rm_dir), "device": "cpu"}]})
    result = score_samples(reward, [RewardSample("3+4=", "7", {"answer": "7"})], RUN)
    parts = result.components[0]
    assert parts["exact_match"] == 1.0 and parts["llm_judge"] == 7.0
    assert result.values_B[0].item() == pytest.approx(1.0 + 3.5 + 2.0 * parts["reward_model"], rel=1e-5)
    failed = score_samples(reward, [RewardSample("3+4=", "9", {"answer": "7"})], RUN)
    assert failed.status_B.tolist() == [RewardStatus.ERROR] and "llm_judge" in failed.reasons[0]


@pytest.mark.parametrize(("options", "message"), [
    ({"template": "{question}"}, "unknown placeholder(s) ['question']"),
    ({"pattern": r"\d+"}, "needs a capture group"),
    ({"min_score": 5, "max_score": 5}, "max_score=5.0 must be above min_score=5.0"),
])
def test_llm_judge_config_errors(options: dict, message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=re.escape(message)):
        REWARDS.parse({"name": "llm_judge", "model_path": "m", **options})


def test_llm_judge_runs_on_the_real_hf_engine(tiny_model_dir: Path) -> None:
    """The tiny model as a greedy judge: its reply is decoded and parsed (digits are its whole alphabet)."""
    reward = REWARDS.build({"name": "llm_judge", "model_path": str(tiny_model_dir), "engine": {"name": "hf"},
                            "template": "{prompt}{response}=", "pattern": r"(\d)", "max_score": 9, "retries": 0})
    samples = [RewardSample(f"{a}+1=", str(a + 1), {}) for a in range(4)]
    result = score_samples(reward, samples, RUN)
    for status, reason, value in zip(result.status_B.tolist(), result.reasons, result.values_B.tolist()):
        assert status == RewardStatus.OK and 0.0 <= value <= 1.0 or "no score in the judge's reply" in reason
    replies = reward.ask(["1+1=2="])  # type: ignore[attr-defined]
    assert len(replies) == 1 and isinstance(replies[0], str)
