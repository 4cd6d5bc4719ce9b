"""The continuous batcher, stepped by hand: requests join while others decode, leave in any order, and each gets the
tokens it would get alone (greedy: the model's own full forward, no cache; sampled: the same seed alone).

Both caches run: the lean decoders' slot cache (`SlotKV`, started small so it grows and then compacts) and the
``DynamicCache`` one other models use (`DynamicKV`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from toolbox.models.loading import load_causal_lm
from toolbox.serving.kv import DynamicKV, SlotKV, running_kv
from toolbox.serving.scheduler import ContinuousBatcher
from toolbox.serving.sequence import Delta, SamplingParams, Sequence


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    return load_causal_lm(str(tiny_model_dir)).eval()


def batcher_for(model: Any, kind: str) -> ContinuousBatcher:
    batcher = ContinuousBatcher(model, pad_id=0, max_batch_size=4)
    batcher.kv = running_kv(model, 4, 0, slots=16) if kind == "slots" else DynamicKV(model, 0)
    assert isinstance(batcher.kv, SlotKV if kind == "slots" else DynamicKV)
    return batcher


def sequence(prompt: list[int], max_tokens: int, temperature: float = 0.0, seed: int = 0) -> Sequence:
    events: list[Delta | BaseException] = []
    return Sequence(prompt, SamplingParams(max_tokens, temperature, ignore_eos=True),
                    torch.Generator().manual_seed(seed), events.append, lambda ids: " ".join(map(str, ids)), None)


def greedy_alone(model: Any, prompt: list[int], max_tokens: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def run(batcher: ContinuousBatcher, arrivals: dict[int, list[Sequence]]) -> int:
    """Step until every sequence finished; ``arrivals[step]`` join at that step. The steps taken."""
    step = 0
    with torch.inference_mode():
        while step <= max(arrivals) or batcher._running:
            batcher._step(arrivals.get(step, []))
            step += 1
    return step


@pytest.mark.parametrize("kind", ["slots", "dynamic"])
def test_requests_join_while_others_decode_and_get_their_own_tokens(model: Any, kind: str) -> None:
    batcher = batcher_for(model, kind)
    a = sequence([5, 6, 3, 7, 8, 14], 12)
    b = sequence([9, 4, 3, 5, 5, 14, 7, 7, 3, 6, 2, 9, 14], 10)  # longer than the slots filled when it joins
    c = sequence([4, 14], 5)  # joins with b, leaves first: the last row moves into its place
    d = sequence([6, 6, 3, 1, 14], 20)  # joins late, outlives the rest
    run(batcher, {0: [a], 2: [b, c], 8: [d]})
    assert batcher.peak_running == 3
    for seq in (a, b, c, d):
        assert seq.finish == "length"
        assert seq.token_ids == greedy_alone(model, seq.prompt_ids, seq.params.max_tokens)
    if kind == "slots":
        # 38 slots were written in all: 16 grew to 32 while a and b held slot 0, then d's unused left slots went.
        assert batcher.kv.full.shape[4] == 32


def test_a_sampled_request_draws_the_same_tokens_alone_and_in_a_busy_batch(model: Any) -> None:
    alone = sequence([5, 6, 3, 7, 8, 14], 16, temperature=1.0, seed=42)
    run(batcher_for(model, "slots"), {0: [alone]})
    busy = sequence([5, 6, 3, 7, 8, 14], 16, temperature=1.0, seed=42)
    others = [sequence([4, 3, 14], 12, temperature=0.8, seed=s) for s in range(3)]
    run(batcher_for(model, "slots"), {0: others[:2], 3: [busy], 5: others[2:]})
    assert busy.token_ids == alone.token_ids and len(alone.token_ids) == 16
