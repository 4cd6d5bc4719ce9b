"""`TensorFields`: the step's dataclasses pickle their tensors as numpy arrays and come back equal, writable, and
with whatever numpy cannot hold pickled the torch way."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import ray.cloudpickle
import torch

from toolbox.core.wire import TensorFields
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


@dataclass
class Mixed(TensorFields):
    plain: torch.Tensor
    many: list[torch.Tensor]
    half: torch.Tensor  # bf16: numpy has no such dtype
    grad: torch.Tensor
    other: dict[str, int]
    empty: list[torch.Tensor]


def batch(rows: int = 3) -> RolloutBatch:
    return RolloutBatch(torch.arange(rows * 2).view(rows, 2), torch.ones(rows, 2, dtype=torch.long),
                        torch.arange(rows * 3).view(rows, 3), torch.ones(rows, 3, dtype=torch.long),
                        torch.randn(rows, 3), torch.arange(rows), torch.zeros(rows, dtype=torch.long),
                        [{"answer": str(i)} for i in range(rows)], seconds=0.5)


def test_a_batch_comes_back_equal_and_writable() -> None:
    for dumps, loads in ((pickle.dumps, pickle.loads), (ray.cloudpickle.dumps, ray.cloudpickle.loads)):
        sent = batch()
        back = loads(dumps(sent, protocol=5))
        assert type(back) is RolloutBatch and back.extras == sent.extras and back.seconds == 0.5
        for name in ("prompt_ids_BP", "response_ids_BR", "logprobs_BR", "group_B"):
            assert torch.equal(getattr(back, name), getattr(sent, name))
            assert getattr(back, name).dtype == getattr(sent, name).dtype
        back.logprobs_BR += 1  # its own memory, not the pickle's
        assert not torch.equal(back.logprobs_BR, sent.logprobs_BR)


def test_arrays_not_torch_archives_travel() -> None:
    data = pickle.dumps(batch(), protocol=5)
    assert b"numpy" in data and b"_load_from_bytes" not in data
    rewards = RewardResult(torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long), [])
    assert b"_load_from_bytes" not in pickle.dumps(rewards, protocol=5)


def test_what_numpy_cannot_hold_pickles_as_before() -> None:
    sent = Mixed(torch.arange(4), [torch.ones(2), torch.zeros(3)], torch.ones(2, dtype=torch.bfloat16),
                 torch.ones(2, requires_grad=True), {"a": 1}, [])
    back = pickle.loads(pickle.dumps(sent, protocol=5))
    assert torch.equal(back.plain, sent.plain) and [t.tolist() for t in back.many] == [[1, 1], [0, 0, 0]]
    assert back.half.dtype == torch.bfloat16 and back.grad.requires_grad and back.other == {"a": 1}
    assert back.empty == []
    assert all(isinstance(t, torch.Tensor) for t in back.many)
