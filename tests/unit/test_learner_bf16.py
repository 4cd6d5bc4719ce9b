"""bf16 and memory on one learner rank without a GPU: FSDP2 over a one-rank gloo group in this process, and the
single strategy's autocast.

The PPO critic under bf16 mixed precision and in a bf16 model, a single rank's bf16 compute, the packing checks'
tolerance from the compute dtype, the frozen reference's root group freed after its forward, the CPU fast path of
``full_state_dict`` gathering to rank 0 only. Not covered: CUDA memory (tests/gpu).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from pydantic import ValidationError
from torch.distributed.tensor import DTensor

from toolbox.data.packing import check_packing
from toolbox.learner.config import LearnerConfig
from toolbox.learner.packed import RowForwards
from toolbox.learner.policy import PolicyRank
from toolbox.learner.strategy import Placement, full_state_dict, wrap
from toolbox.models.value import load_value_model, response_values
from toolbox.rl.batch import RolloutBatch


@pytest.fixture
def one_gloo_rank(tmp_path: Path, one_torch_thread: None) -> Iterator[None]:
    """A one-rank gloo process group for the test (FSDP2 needs one), destroyed after."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _rows(vocab: int) -> RolloutBatch:
    gen = torch.Generator().manual_seed(0)
    return RolloutBatch(
        prompt_ids_BP=torch.randint(3, vocab, (2, 4), generator=gen), prompt_mask_BP=torch.ones(2, 4, dtype=torch.long),
        response_ids_BR=torch.randint(3, vocab, (2, 3), generator=gen),
        response_mask_BR=torch.ones(2, 3, dtype=torch.long), logprobs_BR=torch.zeros(2, 3),
        group_B=torch.arange(2), finish_B=torch.zeros(2, dtype=torch.long))


def _cfg(**options: object) -> LearnerConfig:
    return LearnerConfig(**{"num_workers": 1, "strategy": "fsdp2", "device": "cpu", **options})


@pytest.mark.parametrize(("dtype", "precision"), [("float32", "bf16"), ("bfloat16", "fp32")])
def test_critic_trains_under_bf16(tiny_model_dir: Path, one_gloo_rank: None, dtype: str, precision: str) -> None:
    cfg = _cfg(mixed_precision=precision)
    critic = wrap(load_value_model(str(tiny_model_dir), dtype).train(), cfg.strategy, Placement.of(cfg))
    batch = _rows(critic.model.config.vocab_size)
    values = response_values(critic, batch)
    assert values.dtype == torch.float32 and values.shape == (2, 3)
    values.sum().backward()
    assert all(p.grad is not None for p in critic.head.parameters())


def test_single_rank_bf16_autocasts_and_keeps_fp32_state(tiny_model_dir: Path, one_torch_thread: None) -> None:
    cfg = LearnerConfig(num_workers=1, strategy="single", mixed_precision="bf16")
    policy = PolicyRank.pretrained(str(tiny_model_dir), "float32", cfg, 4)
    batch = _rows(policy.model.config.vocab_size)
    ids, mask, positions = batch.model_inputs()
    logits = policy.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    assert logits.dtype == torch.bfloat16  # the compute
    logits.float().logsumexp(-1).mean().backward()
    assert {p.dtype for p in policy.model.parameters()} == {p.grad.dtype for p in policy.model.parameters()} == {
        torch.float32}
    with pytest.raises(ValidationError, match="mixed_precision: 'bf16' needs learner.strategy fsdp2 or single"):
        LearnerConfig(num_workers=2, strategy="ddp", mixed_precision="bf16")


class HalfCompute(torch.nn.Module):
    """fp32 parameters, bf16 logits (FSDP2's mixed precision, autocast); a packed row's logits 1% off."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, input_ids: torch.Tensor, **_: object) -> SimpleNamespace:
        rows, tokens = input_ids.shape
        return SimpleNamespace(logits=(torch.ones(rows, tokens, 8) * (1.01 if tokens > 5 else 1.0)).bfloat16())


def test_packing_tolerance_follows_the_compute_dtype() -> None:
    check_packing(HalfCompute(), 8)  # a bf16 rounding difference, not a leak across documents
    with pytest.raises(RuntimeError, match="attends across packed documents"):
        check_packing(HalfCompute(), 8, tol=1e-3)


def test_packing_checks_pass_under_fsdp2_bf16(tiny_model_dir: Path, one_gloo_rank: None) -> None:
    cfg = _cfg(mixed_precision="bf16", packing=True)
    policy = PolicyRank.pretrained(str(tiny_model_dir), "float32", cfg, 4)
    assert next(policy.model.parameters()).dtype == torch.float32  # the sharded parameters
    RowForwards.of(policy, True, 1.0, True)  # checks packing and shared prompts at start


def test_frozen_reference_frees_its_root_group_after_forward(tiny_model_dir: Path, one_gloo_rank: None) -> None:
    policy = PolicyRank.pretrained(str(tiny_model_dir), "float32", _cfg(), 4, frozen_reference=True)
    ref = policy.ref
    assert ref is not None
    batch = _rows(policy.model.config.vocab_size)
    ids, mask, positions = batch.model_inputs()
    with torch.no_grad():
        ref(input_ids=ids, attention_mask=mask, position_ids=positions)
    root = [ref.get_input_embeddings().weight, ref.get_output_embeddings().weight]
    assert all(isinstance(p, DTensor) for p in root)  # sharded again, not held gathered until the run ends


def test_cpu_state_dict_gathers_to_rank0_only(tiny_model_dir: Path, one_gloo_rank: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    policy = PolicyRank.pretrained(str(tiny_model_dir), "float32", _cfg(), 4)

    def everywhere(*args: object, **kwargs: object) -> None:
        raise AssertionError("all_gather puts a full copy of the model on every rank")

    monkeypatch.setattr(dist, "all_gather", everywhere)
    state = full_state_dict(policy.model)
    assert state and all(not isinstance(t, DTensor) for t in state.values())
