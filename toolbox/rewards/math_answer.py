"""``math_verify``: is the response's final answer mathematically equal to the reference?

Extraction and comparison are the `math-verify` package's (LaTeX, ``\\boxed{}``, fractions,
percentages, units and thousands separators); this module only narrows each text to its final
answer first and puts a deadline on the check:

- GSM8K-style solutions end in ``#### 42``: on either side, the text after the last marker is the
  answer (the marker is an option).
- A response that uses answer tags (``<answer>42</answer>``) is judged on the last tag's content.
- Otherwise the whole response goes to ``math_verify.parse``, which prefers ``\\boxed{}``, "the final
  answer is", "answer: ..." and, unless ``require_anchor`` is set, falls back to the last number.

Outcomes: no reference in ``extras["answer"]`` abstains; a reference `math-verify` cannot parse is
an error (a data problem, never a silent 0); a response without an extractable answer scores
``score_wrong`` (an answer missing is an answer wrong, so RL pushes towards giving one).

math-verify's own timeouts use ``signal.alarm``, which fails off the main thread, and reward workers
score in threads; they are switched off here, and ``timeout_s`` bounds each check instead. A check
past its deadline is a per-sample error; its thread cannot be killed and finishes in the background.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from toolbox.rewards.base import REWARDS, Reward, RewardSample

T = TypeVar("T")


class MathVerifyConfig(BaseModel):
    """Options of ``math_verify``."""

    model_config = ConfigDict(extra="forbid")
    timeout_s: float = Field(5.0, gt=0, description="Deadline for parsing and comparing one sample; a later "
                             "verdict makes the sample an error.")
    marker: str | None = Field("####", description="Final-answer marker (GSM8K's `#### 42`): on both the "
                               "reference and the response, only the text after the last marker is the "
                               "answer. null: no marker.")
    answer_tag: str | None = Field("answer", pattern=r"^[A-Za-z][\w-]*$", description="When the response "
                                   "contains `<TAG>...</TAG>`, only the last such content is its answer. "
                                   "null: ignore tags.")
    require_anchor: bool = Field(False, description="Which answer to take from a response with neither marker "
                                 "nor tag: false takes math-verify's best guess, down to the last number in the "
                                 "text; true takes only an anchored answer (`\\boxed{}`, 'the final answer is', "
                                 "'answer:'), so a response that merely contains the number scores as wrong.")
    score_correct: float = Field(1.0, description="Reward when the answers are equal.")
    score_wrong: float = Field(0.0, description="Reward when they differ or the response has no answer.")


def final_answer_text(text: str, marker: str | None, tag: str | None) -> tuple[str, bool]:
    """The part of ``text`` that holds its final answer, and whether a tag or marker pointed to it.

    The last ``<tag>...</tag>`` content is taken first, then the text after the last ``marker`` in it.
    """
    anchored = False
    if tag is not None:
        contents = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
        if contents:
            text, anchored = contents[-1], True
    if marker and marker in text:
        text, anchored = text.rsplit(marker, 1)[1], True
    return text.strip(), anchored


def _drop_disabled_timeout_warning(record: logging.LogRecord) -> bool:
    """math-verify warns once that its timeout is off; here the deadline is ours, so the warning is noise."""
    return not record.getMessage().startswith("Timeout is disabled")


def _quiet_math_verify() -> None:
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if _drop_disabled_timeout_warning not in logger.filters:
            logger.addFilter(_drop_disabled_timeout_warning)


def call_with_deadline(fn: Callable[..., T], timeout_s: float, *args: Any) -> T:
    """``fn(*args)`` in a daemon thread; raises ``TimeoutError`` when it has not returned after ``timeout_s``.

    Works from any thread (unlike ``signal.alarm``). A call that overruns is abandoned, not stopped.
    """
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # handed to the caller below, which re-raises it
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="math_verify", daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeoutError(f"math_verify: no verdict within {timeout_s}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@functools.lru_cache(maxsize=4096)
def _parse_reference(reference: str, marker: str | None) -> list[Any]:
    """The parsed reference answer (cached: every sample of a group shares one reference)."""
    from math_verify import parse

    text, _ = final_answer_text(reference, marker, None)
    gold = parse(text, parsing_timeout=None)  # None: no signal.alarm (see the module docstring)
    if not gold:
        raise ValueError(f"math_verify: cannot parse the reference answer {reference!r}")
    return list(gold)


def _extraction(anchor_only: bool) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(try_extract_without_anchor=not anchor_only),
            ExprExtractionConfig(try_extract_without_anchor=not anchor_only)]


@REWARDS.register("math_verify", config=MathVerifyConfig)
def math_verify_reward(config: MathVerifyConfig) -> Reward:
    """``score_correct`` when the response's final answer equals the reference's, per `math-verify`."""
    from math_verify import parse, verify

    _quiet_math_verify()
    free, anchored_only = _extraction(False), _extraction(True)

    def check(reference: str, response: str) -> bool:
        gold = _parse_reference(reference, config.marker)
        text, anchored = final_answer_text(response, config.marker, config.answer_tag)
        extraction = anchored_only if config.require_anchor and not anchored else free
        answer = parse(text, extraction_config=extraction, parsing_timeout=None)
        return bool(answer) and verify(gold, answer, timeout_seconds=None)

    def score(sample: RewardSample) -> float | None:
        reference = sample.extras.get("answer")
        if reference is None:
            return None
        correct = call_with_deadline(check, config.timeout_s, str(reference), sample.response)
        return config.score_correct if correct else config.score_wrong

    return score
