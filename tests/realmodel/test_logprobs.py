"""Behaviour log-probs on SmolLM2 in fp32: the ``hf`` engine's (its own Llama forward over a static KV cache) equal
the GRPO learner's recomputation of the same tokens, padded and packed with shared prompts, within 1e-4.

Two chat prompts of different lengths, three samples each at temperature 0.7 (a learner that forgot the temperature,
or scored the token after the one sampled, is off by far more than 1e-4): a short question some samples answer
within the 10 tokens and stop at EOS, and an open one every sample runs to the limit on.

Not covered: bf16 (its rounding is larger than the tolerance here), the ``generate`` decode path (the toy-model
tests compare the two paths).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from toolbox.data.encode import render_prompt
from toolbox.engines.base import SamplingConfig
from toolbox.learner.packed import RowForwards
from toolbox.models.logprobs import response_logprobs
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, PromptRequest, RolloutBatch

pytestmark = pytest.mark.slow

TEMPERATURE = 0.7
QUESTIONS = ["What is the capital of France? Answer in one word.", "Tell me about apples."]


@pytest.fixture(scope="module")
def sampled(smollm2_engine: Any) -> RolloutBatch:
    tok = smollm2_engine.tokenizer
    requests = [PromptRequest(render_prompt(q, tok, True, "Answer in as few words as possible."), g)
                for g, q in enumerate(QUESTIONS) for _ in range(3)]
    torch.manual_seed(3)  # the engine samples from torch's global generator
    return smollm2_engine.generate(requests, SamplingConfig(max_new_tokens=10, temperature=TEMPERATURE))


def test_engine_logprobs_equal_the_one_function_on_the_learners_model(smollm2_learner: Any,
                                                                      sampled: RolloutBatch) -> None:
    assert set(sampled.finish_B.tolist()) == {FINISH_STOP, FINISH_LENGTH}, "rows of both kinds: EOS and the limit"
    with torch.no_grad():
        learner_BR = response_logprobs(smollm2_learner.policy.model, sampled, TEMPERATURE)
    diff = (learner_BR - sampled.logprobs_BR).abs().max().item()
    assert diff <= 1e-4, f"max abs difference {diff:.2e}"
    assert (learner_BR[sampled.response_mask_BR == 0] == 0).all()


def test_packed_forwards_with_shared_prompts_give_the_engines_logprobs(smollm2_learner: Any,
                                                                       sampled: RolloutBatch) -> None:
    """The learner's own forwards: padded, and packed with each prompt held once for its three samples."""
    model = smollm2_learner.policy.model
    padded = RowForwards(False, TEMPERATURE)
    packed = RowForwards.of(smollm2_learner.policy, True, TEMPERATURE, share_prompts=True)
    assert packed.share_prompts, "sdpa attention on the real model takes the shared-prompt mask"
    packed.reset()  # `of` counted the forwards of its start-up check
    with torch.no_grad():
        out = {"padded": padded.logprobs(model, sampled), "packed": packed.logprobs(model, sampled)}
    for name, logp_BR in out.items():
        diff = (logp_BR - sampled.logprobs_BR).abs().max().item()
        assert diff <= 1e-4, f"{name}: max abs difference {diff:.2e}"
    # The packed forward ran over each prompt once: fewer slots than the real tokens of every row's own copy.
    real = int(sampled.prompt_mask_BP.sum() + sampled.response_mask_BR.sum())
    assert packed.real < real < padded.slots
    assert packed.real == real - 2 * int(sampled.prompt_mask_BP[0].sum()) - 2 * int(sampled.prompt_mask_BP[3].sum())
