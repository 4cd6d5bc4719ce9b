"""Mixed precision and activation checkpointing on 2 real FSDP2 ranks (torch.distributed gloo, CPU), without Ray.

Two spawned processes train the tiny model for a few steps on fixed data three ways: fp32, fp32 with activation
checkpointing, bf16 mixed precision with activation checkpointing. Checkpointing must change no gradient
(bit-exact in fp32); bf16 must track the fp32 loss curve within `BF16_LOSS_TOL`.
Not covered: CUDA (tests/gpu), nccl, CPU offload (a no-op on CPU ranks).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.unit.learner_steps import spawn_two_gloo_ranks
from toolbox.learner.config import LearnerConfig
from toolbox.learner.policy import PolicyRank
from toolbox.learner.strategy import peak_memory_gb
from toolbox.models.logprobs import response_logprobs
from toolbox.rl.batch import RolloutBatch

STEPS, ROWS, PROMPT, RESPONSE = 4, 4, 5, 6  # ROWS per rank
# bf16 keeps 8 mantissa bits: per-token log-probs of the tiny model move by ~1e-2 at most; the mean loss of a
# few steps stays within this of fp32 (measured: max |diff| 1.7e-3 over 6 steps).
BF16_LOSS_TOL = 1e-2
MODES = {"fp32": ("fp32", False), "fp32_ckpt": ("fp32", True), "bf16_ckpt": ("bf16", True)}


def _rows(rank: int, vocab: int) -> RolloutBatch:
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own rows, the same for every mode
    resp_mask = torch.ones(ROWS, RESPONSE, dtype=torch.long)
    resp_mask[0, -2:] = 0  # one short response: padding must stay out of the loss
    return RolloutBatch(
        prompt_ids_BP=torch.randint(3, vocab, (ROWS, PROMPT), generator=gen),
        prompt_mask_BP=torch.ones(ROWS, PROMPT, dtype=torch.long),
        response_ids_BR=torch.randint(3, vocab, (ROWS, RESPONSE), generator=gen),
        response_mask_BR=resp_mask,
        logprobs_BR=torch.zeros(ROWS, RESPONSE),
        group_B=torch.arange(ROWS),
        finish_B=torch.zeros(ROWS, dtype=torch.long),
    )


def _train(model_dir: str, mixed_precision: str, ckpt: bool, rank: int) -> dict:
    cfg = LearnerConfig(num_workers=2, strategy="fsdp2", device="cpu", mixed_precision=mixed_precision,
                        activation_checkpointing=ckpt, optim={"lr": 3e-3, "scheduler": "constant"})
    torch.manual_seed(0)
    policy = PolicyRank.pretrained(model_dir, "float32", cfg, STEPS)
    batch = _rows(rank, policy.model.config.vocab_size)
    losses, first_grads = [], []
    for step in range(STEPS):
        logp_BR = response_logprobs(policy.model, batch, 1.0)
        loss = -(logp_BR * batch.response_mask_BR).sum() / batch.response_mask_BR.sum()
        loss.backward()
        if step == 0:
            first_grads = [p.grad.to_local().clone() for p in policy.model.parameters()]
        total = torch.tensor([float(loss)], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(float(total) / dist.get_world_size())
        policy.optimizer_step()
    torch.save(first_grads, Path(model_dir).parent / f"grads_{mixed_precision}_{ckpt}_{rank}.pt")
    return {"losses": losses, "param_dtype": str(next(policy.model.parameters()).dtype),
            "state_dtypes": sorted({str(v.dtype) for s in policy.optimizer.state.values() for v in s.values()
                                    if isinstance(v, torch.Tensor) and v.dim() > 0}),
            "peak_mem_gb": peak_memory_gb(torch.device("cpu"))}


def _rank(rank: int, model_dir: str, out: str) -> None:
    results = {name: _train(model_dir, *mode, rank) for name, mode in MODES.items()}
    if rank == 0:
        Path(out).write_text(json.dumps(results))


@pytest.fixture(scope="module")
def curves(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    work = tmp_path_factory.mktemp("precision")
    model_dir = work / "model"
    model_dir.symlink_to(tiny_model_dir, target_is_directory=True)
    out = work / "curves.json"
    spawn_two_gloo_ranks(_rank, model_dir, out)
    return json.loads(out.read_text()), work


def test_activation_checkpointing_changes_no_gradient(curves: tuple[dict, Path]) -> None:
    results, work = curves
    for rank in (0, 1):
        plain = torch.load(work / f"grads_fp32_False_{rank}.pt")
        ckpt = torch.load(work / f"grads_fp32_True_{rank}.pt")
        assert len(plain) == len(ckpt) > 0
        for a, b in zip(plain, ckpt):
            assert torch.equal(a, b), f"rank {rank}: a gradient shard differs with activation checkpointing"
    assert results["fp32_ckpt"]["losses"] == results["fp32"]["losses"]


def test_bf16_mixed_precision_tracks_fp32_loss_curve(curves: tuple[dict, Path]) -> None:
    results, _ = curves
    fp32, bf16 = results["fp32"]["losses"], results["bf16_ckpt"]["losses"]
    assert fp32[-1] < fp32[0] - 0.05, f"fp32 did not learn: {fp32}"  # the curve has a shape to track
    diffs = [abs(a - b) for a, b in zip(fp32, bf16)]
    assert max(diffs) < BF16_LOSS_TOL, f"bf16 loss curve {bf16} left fp32 {fp32} by {max(diffs):.4f}"
    assert bf16 != fp32, "bf16 ran exactly like fp32: mixed precision was not applied"
    # Sharded parameters and AdamW state stay fp32; only the gathered copies used for compute are bf16.
    assert results["bf16_ckpt"]["param_dtype"] == "torch.float32"
    assert results["bf16_ckpt"]["state_dtypes"] == ["torch.float32"]
    assert results["fp32"]["peak_mem_gb"] > 0
