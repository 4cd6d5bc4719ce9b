"""`math_verify` and `format` rewards, alone and inside `weighted_sum` (built from the typed config)."""

from __future__ import annotations

import threading
import time

import pytest

from toolbox.config.loader import load_config
from toolbox.core.errors import ConfigError
from toolbox.rewards import REWARDS, RewardSample, RewardStatus
from toolbox.rewards.math_answer import call_with_deadline, final_answer_text
from toolbox.rewards.runner import RewardRunConfig, score_samples

GSM8K_REFERENCE = "Ava has 3 + 4 = 7 apples.\nShe eats 2, so 7 - 2 = 5 are left.\n#### 5"


def sample(response: str, answer: str | None = GSM8K_REFERENCE) -> RewardSample:
    return RewardSample("question", response, {} if answer is None else {"answer": answer})


def in_thread(reward, s: RewardSample) -> float | None:  # noqa: ANN001
    """Score off the main thread, as reward workers do (math-verify's signal timeouts would fail here)."""
    out: dict[str, float | None] = {}
    worker = threading.Thread(target=lambda: out.setdefault("v", reward(s)))
    worker.start()
    worker.join(30.0)
    assert "v" in out, "the reward raised or hung off the main thread"
    return out["v"]


# ---- final-answer extraction ----------------------------------------------------------------------
@pytest.mark.parametrize(("text", "expected"), [
    (GSM8K_REFERENCE, ("5", True)),
    ("a #### 3 then #### 4", ("4", True)),                      # the last marker wins
    ("<think>2+2=4</think><answer>#### 4</answer>", ("4", True)),  # tag first, then marker inside it
    ("<answer>1</answer> <answer>2</answer>", ("2", True)),    # the last tag wins
    ("the answer is 9", ("the answer is 9", False)),           # nothing to narrow: math-verify decides
])
def test_final_answer_text(text: str, expected: tuple[str, bool]) -> None:
    assert final_answer_text(text, "####", "answer") == expected


# ---- math_verify -------------------------------------------------------------------------------
@pytest.mark.parametrize(("response", "score"), [
    ("#### 5", 1.0),
    ("7 - 2 = 5 apples.\n#### 5", 1.0),
    ("The final answer is $\\boxed{5}$.", 1.0),
    ("so the answer is 5.", 1.0),
    ("\\frac{10}{2}", 1.0),
    ("<think>7 - 2</think><answer>5</answer>", 1.0),
    ("#### 6", 0.0),
    ("5 are left.\n#### 6", 0.0),            # the marked answer counts, not the last-but-one number
    ("\\boxed{7}", 0.0),
    ("<think>5</think><answer>7</answer>", 0.0),
    ("no idea", 0.0),                       # no answer at all scores as wrong, not an abstention
    ("", 0.0),
])
def test_math_verify_gsm8k_reference(response: str, score: float) -> None:
    reward = REWARDS.build({"name": "math_verify"})
    assert in_thread(reward, sample(response)) == score


@pytest.mark.parametrize(("reference", "response"), [
    ("\\frac{1}{2}", "0.5"),
    ("0.5", "The answer is $\\frac{1}{2}$"),
    ("1/2", "\\boxed{\\dfrac{1}{2}}"),
    ("12", "It costs \\boxed{12\\text{ dollars}}."),  # units stripped
    ("1234", "#### 1,234"),                           # thousands separator
])
def test_math_verify_equivalent_forms(reference: str, response: str) -> None:
    assert in_thread(REWARDS.build({"name": "math_verify"}), sample(response, reference)) == 1.0


def test_math_verify_abstains_without_reference_and_fails_on_unparseable_one() -> None:
    reward = REWARDS.build({"name": "math_verify"})
    assert reward(sample("#### 5", answer=None)) is None
    with pytest.raises(ValueError, match=r"cannot parse the reference answer 'lots'"):
        reward(sample("#### 5", answer="lots"))


def test_math_verify_options() -> None:
    anchored = REWARDS.build({"name": "math_verify", "require_anchor": True})
    assert anchored(sample("I counted 5")) == 0.0  # a bare number is not an answer when anchors are required
    assert anchored(sample("answer: 5")) == 1.0 and anchored(sample("#### 5")) == 1.0
    assert REWARDS.build({"name": "math_verify"})(sample("I counted 5")) == 1.0
    unmarked = REWARDS.build({"name": "math_verify", "marker": None})
    assert unmarked(sample("5", answer="#### 5")) == 1.0  # math-verify alone still finds a number after ####
    assert unmarked(sample("#### 5 is wrong, 6", answer="6")) == 1.0  # without the marker, the last number wins
    scaled = REWARDS.build({"name": "math_verify", "score_correct": 2.0, "score_wrong": -1.0})
    assert scaled(sample("#### 5")) == 2.0 and scaled(sample("#### 4")) == -1.0
    with pytest.raises(ConfigError, match=r"reward\.spec\.timeout_s: Input should be greater than 0"):
        REWARDS.validate({"name": "math_verify", "timeout_s": 0}, "reward.spec")


def test_math_verify_in_the_threaded_runner() -> None:
    reward = REWARDS.build({"name": "math_verify"})
    samples = [sample("#### 5"), sample("#### 4"), sample("#### 5", answer=None), sample("#### 5", answer="?")]
    result = score_samples(reward, samples, RewardRunConfig(timeout_s=30.0, threads=4))
    assert result.status_B.tolist() == [RewardStatus.OK, RewardStatus.OK, RewardStatus.ABSTAIN, RewardStatus.ERROR]
    assert result.values_B.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert result.reasons[3] == "ValueError: math_verify: cannot parse the reference answer '?'"


def test_call_with_deadline() -> None:
    assert call_with_deadline(lambda x: x + 1, 1.0, 1) == 2
    with pytest.raises(KeyError, match="inner"):
        call_with_deadline(lambda: {}["inner"], 1.0)
    release = threading.Event()
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"no verdict within 0\.1s"):
            call_with_deadline(release.wait, 0.1, 10.0)
    finally:
        release.set()
    assert time.monotonic() - start < 5.0


# ---- format ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("response", "score"), [
    ("<think>7 - 2</think><answer>5</answer>", 1.0),
    ("  <think>a\nb</think>\n<answer>5</answer>\n", 1.0),  # whitespace around and between the tags is fine
    ("<answer>5</answer>", 0.0),                          # a tag missing
    ("<answer>5</answer><think>x</think>", 0.0),          # out of order
    ("<think> </think><answer>5</answer>", 0.0),          # empty content
    ("<think>a<think>b</think><answer>5</answer>", 0.0),  # a nested opening tag
    ("<think>a</think><answer>5</answer> and more", 0.0),  # text after the last tag
])
def test_format_default_tags(response: str, score: float) -> None:
    assert REWARDS.build({"name": "format"})(sample(response)) == score


def test_format_pattern_tags_and_scores() -> None:
    marker = REWARDS.build({"name": "format", "pattern": r"(?s).*#### -?\d+"})
    assert marker(sample("2 + 3 = 5\n#### 5")) == 1.0 and marker(sample("#### 5 apples")) == 0.0
    anywhere = REWARDS.build({"name": "format", "pattern": r"#### -?\d+", "match": "search"})
    assert anywhere(sample("#### 5 apples")) == 1.0
    one_tag = REWARDS.build({"name": "format", "tags": ["answer"], "score_match": 0.5, "score_mismatch": -0.5})
    assert one_tag(sample("<answer>5</answer>")) == 0.5 and one_tag(sample("5")) == -0.5
    assert one_tag(sample("<answer>5</answer>", answer=None)) == 0.5  # needs no reference: never abstains


@pytest.mark.parametrize(("options", "message"), [
    ({"pattern": "(", "tags": None}, r"reward\.spec\.pattern: Value error, not a valid regular expression"),
    ({"tags": ["ok", "<b>"]}, r"reward\.spec\.tags: Value error, tag '<b>' is not a tag name"),
    ({"pattern": "x", "tags": ["a"]}, r"reward\.spec: Value error, format: set `pattern` or `tags`, not both"),
    ({"match": "prefix"}, r"reward\.spec\.match: Input should be 'full' or 'search'"),
])
def test_format_option_errors_name_the_path(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        REWARDS.validate({"name": "format", **options}, "reward.spec")


# ---- weighted_sum of correctness and format, through the experiment config -------------------------
def test_weighted_sum_of_math_verify_and_format_from_the_config() -> None:
    cfg = load_config(["reward.spec={name: weighted_sum, weights: [1.0, 0.25], components: "
                       "[{name: math_verify, require_anchor: true}, {name: format, tags: [answer]}]}"])
    first, second = cfg.reward.spec.components  # type: ignore[attr-defined]
    assert type(first) is REWARDS.spec_model("math_verify") and first.require_anchor is True
    assert type(second) is REWARDS.spec_model("format") and second.tags == ["answer"]
    reward = REWARDS.build(cfg.reward.spec)
    assert in_thread(reward, sample("<answer>5</answer>")) == pytest.approx(1.25)  # right and well formed
    assert in_thread(reward, sample("<answer>4</answer>")) == pytest.approx(0.25)  # well formed only
    assert in_thread(reward, sample("#### 5")) == pytest.approx(1.0)               # right only
    assert in_thread(reward, sample("4")) == 0.0
    assert in_thread(reward, sample("<answer>5</answer>", answer=None)) == pytest.approx(0.25)  # format still scores


def test_weighted_sum_component_option_error_names_its_path() -> None:
    with pytest.raises(ConfigError, match=r"reward\.spec\.components\.1\.match: Input should be 'full' or 'search'"):
        load_config(["reward.spec={name: weighted_sum, weights: [1.0, 1.0], "
                     "components: [{name: math_verify}, {name: format, match: prefix}]}"])
