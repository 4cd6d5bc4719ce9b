"""SmolLM2's tokenizer, whose pad token is its EOS token (``<|im_end|>``, id 2), through the ``hf`` engine and the
GRPO learner: left padding that changes no greedy completion, a stop at EOS kept once and masked in, and a loss mask
that keeps each response's own EOS while leaving out the padding after it (the same id).

Not covered: sampling at a temperature (tests/realmodel/test_logprobs.py), multi-turn rows (own_mask_BR).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import toolbox.algorithms.grpo.learner as grpo_learner
from toolbox.data.encode import render_prompt
from toolbox.engines.base import SamplingConfig
from toolbox.objectives.registry import PolicyInputs
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import FINISH_STOP, PromptRequest, RolloutBatch

pytestmark = pytest.mark.slow

EOS = 2  # <|im_end|>: SmolLM2's EOS and pad token
SYSTEM = "Answer in as few words as possible."
# Three prompt lengths, each answered in a few tokens and a stop (checked below, as a precondition).
QUESTIONS = ["What is the capital of France? Answer in one word.", "Name a colour.",
             "What is 2 + 3? Reply with just the number."]
GREEDY = SamplingConfig(max_new_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def requests(smollm2_engine: Any) -> list[PromptRequest]:
    tok = smollm2_engine.tokenizer
    return [PromptRequest(render_prompt(q, tok, True, SYSTEM), group) for group, q in enumerate(QUESTIONS)]


@pytest.fixture(scope="module")
def batch(smollm2_engine: Any, requests: list[PromptRequest]) -> RolloutBatch:
    return smollm2_engine.generate(requests, GREEDY)


def test_tokenizer_pads_with_its_eos_and_keeps_its_bpe_ids(smollm2_tokenizer: Any) -> None:
    """`load_tokenizer`'s tokenizer (the session fixture's): SmolLM2's special tokens and its BPE ids."""
    tok = smollm2_tokenizer
    assert (tok.pad_token, tok.pad_token_id, tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2, "<|im_end|>", 2)
    assert (tok.bos_token, tok.bos_token_id) == ("<|im_start|>", 1)
    assert len(tok) == 49152
    ids = tok("What is 2 + 3?")["input_ids"]
    assert ids == [1780, 314, 216, 34, 1232, 216, 35, 47], "no BOS is added and the BPE merges are SmolLM2's"
    assert tok.convert_ids_to_tokens(ids) == ["What", "Ġis", "Ġ", "2", "Ġ+", "Ġ", "3", "?"]


def test_left_padding_with_eos_ids_changes_no_greedy_completion(smollm2_engine: Any, requests: list[PromptRequest],
                                                                batch: RolloutBatch) -> None:
    lengths = [len(r.ids) for r in requests]
    width = max(lengths)
    assert len(set(lengths)) == 3 and batch.prompt_ids_BP.shape[1] == width
    for i, r in enumerate(requests):
        pad = width - len(r.ids)
        assert batch.prompt_ids_BP[i].tolist() == [EOS] * pad + r.ids
        assert batch.prompt_mask_BP[i].tolist() == [0] * pad + [1] * len(r.ids)
        # The chat turns' own <|im_end|> tokens (system, user) are prompt tokens, unlike the padding of the same id.
        assert r.ids.count(EOS) == 2 and int(batch.prompt_mask_BP[i][batch.prompt_ids_BP[i] == EOS].sum()) == 2
        alone = smollm2_engine.generate([r], GREEDY)
        n = int(alone.response_mask_BR.sum())
        assert int(batch.response_mask_BR[i].sum()) == n, f"row {i}: a different length in the batch"
        assert batch.response_ids_BR[i, :n].tolist() == alone.response_ids_BR[0, :n].tolist(), f"row {i}"
        assert batch.finish_B[i] == alone.finish_B[0]
        torch.testing.assert_close(batch.logprobs_BR[i, :n], alone.logprobs_BR[0, :n], atol=1e-4, rtol=0)


def test_generation_stops_at_eos_kept_once_and_masked_in(smollm2_engine: Any, batch: RolloutBatch) -> None:
    lengths = batch.response_mask_BR.sum(1).tolist()
    assert batch.finish_B.tolist() == [FINISH_STOP] * 3, f"every prompt should be answered within 12 tokens: {lengths}"
    assert len(set(lengths)) > 1 and batch.response_ids_BR.shape[1] == max(lengths) < GREEDY.max_new_tokens
    for i, n in enumerate(lengths):
        ids, mask, logp = batch.response_ids_BR[i], batch.response_mask_BR[i], batch.logprobs_BR[i]
        assert ids[n - 1] == EOS and (ids[: n - 1] != EOS).all(), f"row {i}: one EOS, as the last response token"
        assert mask.tolist() == [1] * n + [0] * (len(ids) - n)
        assert (ids[n:] == EOS).all() and (logp[n:] == 0).all(), f"row {i}: only padding after the EOS"
        assert logp[n - 1] < 0, f"row {i}: the EOS is a sampled token with its own log-prob"
        text = smollm2_engine.tokenizer.decode(ids[:n])
        assert text.endswith("<|im_end|>") and text.count("<|im_end|>") == 1


def test_learner_loss_counts_each_eos_and_no_padding(smollm2_learner: Any, batch: RolloutBatch,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Two responses of different lengths, both ending in EOS, as one group: the loss mask the GRPO update hands its
    loss keeps both EOS tokens and drops the shorter row's padding (also id 2), and the loss averages over their sum."""
    lengths = batch.response_mask_BR.sum(1)
    short, long = int(lengths.argmin()), int(lengths.argmax())
    assert lengths[short] < lengths[long]
    rows = batch.select(torch.tensor([long, short]))
    rows.group_B = torch.zeros(2, dtype=torch.long)
    n_long, n_short = int(lengths[long]), int(lengths[short])
    seen: dict[str, Any] = {}

    class LossReached(Exception):
        """Ends the update at its first loss call, before the backward pass: the shared learner's weights stay."""

    def spy(loss: Any, x: PolicyInputs, *args: Any) -> Any:
        seen.update(logp=x.logp_BT.detach().clone(), mask=x.mask_BT.clone(), tokens=x.token_count)
        raise LossReached

    monkeypatch.setattr(grpo_learner, "policy_objective", spy)
    rewards = RewardResult(torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long), ["", ""])
    learner = smollm2_learner
    plan = learner.plan([rows], [rewards])
    with pytest.raises(LossReached):
        learner.update(plan, {0: rows})
    width = rows.response_ids_BR.shape[1]
    assert seen["mask"].tolist() == [[1] * n_long, [1] * n_short + [0] * (width - n_short)]
    assert seen["tokens"] == n_long + n_short
    eos_BR = rows.response_ids_BR == EOS
    assert int(eos_BR.sum()) == 1 + 1 + (width - n_short), "both EOS tokens and the padding share the id"
    assert (seen["mask"][eos_BR] == 1).sum() == 2 and seen["mask"][1, n_short - 1] == 1
    logp = seen["logp"]
    assert logp[0, n_long - 1] < 0 and logp[1, n_short - 1] < 0, "the learner scores each response's EOS"
    assert (logp[1, n_short:] == 0).all()
