"""The learner rank and the hf engine on CUDA, without Ray: skipped without a GPU (none on the CPU machines).

A 1-rank nccl process group trains the tiny model with FSDP2 three ways (fp32; bf16 mixed precision with
activation checkpointing; the same with CPU offload): every run learns, bf16 tracks fp32, the sharded
parameters and AdamW state stay fp32, peak device memory is reported. Then the learner's exported weights
(CPU buckets read back from the GPU) go into the hf engine on CUDA and change its greedy output.
Run by scripts/gpu_checks.sh; needs torch, transformers, pydantic and pytest (no Ray).
"""

from __future__ import annotations

import os
import socket
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from toolbox.data.prompts import PromptSource
from toolbox.data.tasks import TASKS
from toolbox.engines.base import SamplingConfig
from toolbox.engines.hf import HFEngine, HFEngineConfig
from toolbox.learner.config import LearnerConfig
from toolbox.learner.host_offload import HostOffload
from toolbox.learner.policy import PolicyRank
from toolbox.learner.strategy import backend_for, peak_memory_gb, resolve_device
from toolbox.models.logprobs import response_logprobs
from toolbox.rl.batch import RolloutBatch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
STEPS = 5
BF16_LOSS_TOL = 2e-2  # as tests/unit/test_learner_precision.py, with GPU kernels' own rounding on top


@pytest.fixture(scope="module")
def nccl_group() -> Iterator[None]:
    device = resolve_device("auto")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(backend_for("auto", device), init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _batch(vocab: int) -> RolloutBatch:
    gen = torch.Generator().manual_seed(0)
    return RolloutBatch(prompt_ids_BP=torch.randint(3, vocab, (8, 6), generator=gen),
                        prompt_mask_BP=torch.ones(8, 6, dtype=torch.long),
                        response_ids_BR=torch.randint(3, vocab, (8, 8), generator=gen),
                        response_mask_BR=torch.ones(8, 8, dtype=torch.long), logprobs_BR=torch.zeros(8, 8),
                        group_B=torch.arange(8), finish_B=torch.zeros(8, dtype=torch.long))


def _train(model_dir: Path, between: Callable[[PolicyRank], None] | None = None,
           **options: object) -> tuple[list[float], PolicyRank]:
    """``STEPS`` steps of the tiny model; ``between``: called after each optimizer step (a weight export's place)."""
    cfg = LearnerConfig(num_workers=1, strategy="fsdp2", device="cuda",
                        optim={"lr": 3e-3, "scheduler": "constant"}, **options)
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    policy = PolicyRank.pretrained(str(model_dir), "float32", cfg, STEPS, frozen_reference=True)
    batch, losses = _batch(policy.model.config.vocab_size), []
    for _ in range(STEPS):
        logp_BR = response_logprobs(policy.model, batch, 1.0)
        assert logp_BR.device.type == "cpu"  # computed on the GPU, handed back where the batch lives
        loss = -(logp_BR * batch.response_mask_BR).sum() / batch.response_mask_BR.sum()
        loss.backward()
        losses.append(float(loss))
        policy.optimizer_step()
        if between is not None:
            between(policy)
    with torch.no_grad():
        response_logprobs(policy.ref, batch, 1.0)  # the reference runs too (its shards live in host memory)
    return losses, policy


def test_learner_on_cuda_bf16_checkpointing_offload(nccl_group: None, tiny_model_dir: Path) -> None:
    fp32, policy = _train(tiny_model_dir)
    assert next(policy.model.parameters()).device.type == "cuda"
    assert fp32[-1] < fp32[0] - 0.05, fp32
    peak_fp32 = peak_memory_gb(torch.device("cuda", 0))
    bf16, policy = _train(tiny_model_dir, mixed_precision="bf16", activation_checkpointing=True)
    assert max(abs(a - b) for a, b in zip(fp32, bf16)) < BF16_LOSS_TOL, (fp32, bf16)
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    assert {v.dtype for s in policy.optimizer.state.values() for v in s.values() if v.dim() > 0} == {torch.float32}
    offloaded, policy = _train(tiny_model_dir, mixed_precision="bf16", activation_checkpointing=True, offload="params")
    assert next(policy.model.parameters()).device.type == "cpu"  # FSDP2's CPUOffloadPolicy keeps shards in host memory
    assert max(abs(a - b) for a, b in zip(bf16, offloaded)) < BF16_LOSS_TOL
    print(f"\nfp32 {fp32}\nbf16+ckpt {bf16}\nbf16+ckpt+offload {offloaded}\npeak fp32 {peak_fp32:.4f} GB")
    assert peak_fp32 > 0


def test_learner_weights_into_hf_engine_on_cuda(nccl_group: None, tiny_model_dir: Path) -> None:
    _, policy = _train(tiny_model_dir)
    engine = HFEngine(str(tiny_model_dir), config=HFEngineConfig(device="cuda"), seed=0)
    assert next(engine.model.parameters()).device.type == "cuda"
    requests = PromptSource(TASKS.build({"name": "digit_add"}), engine.tokenizer, seed=0).step(0, 4, 2)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=4)
    before = engine.generate(requests, greedy)
    assert before.response_ids_BR.device.type == "cpu" and torch.isfinite(before.logprobs_BR).all()
    buckets = policy.export_weights()  # numpy byte arrays: read back from the GPU into host memory
    assert buckets
    engine.update_weights(buckets)
    learned = policy.full_state_dict()
    for name, value in engine.state_dict().items():
        torch.testing.assert_close(value.cpu(), learned[name], rtol=0, atol=0)
    after = engine.generate(requests, greedy)
    assert after.response_ids_BR.shape[0] == before.response_ids_BR.shape[0]


def test_offload_while_generating_frees_the_gpu_and_changes_no_step(nccl_group: None, tiny_model_dir: Path) -> None:
    """learner.offload_while_generating: after each step the policy's shards and AdamW state go to host memory (the
    GPU keeps almost nothing), come back for the next step, and the losses are those of a run that never moved; the
    reference, which FSDP2 keeps in host memory for good, stays there."""
    plain, _ = _train(tiny_model_dir)
    freed: list[tuple[int, int]] = []

    def offload_and_back(policy: PolicyRank) -> None:
        host = HostOffload.of(types.SimpleNamespace(policy=policy))
        before = torch.cuda.memory_allocated()
        host.offload()
        assert {p.device.type for p in policy.model.parameters()} == {"cpu"}
        assert {v.device.type for s in policy.optimizer.state.values() for v in s.values()} == {"cpu"}
        freed.append((before, torch.cuda.memory_allocated()))
        host.reload()
        assert {p.device.type for p in policy.model.parameters()} == {"cuda"}
        assert {p.device.type for p in policy.ref.parameters()} == {"cpu"}

    moved, _ = _train(tiny_model_dir, between=offload_and_back, offload_while_generating=True)
    assert moved == plain, (plain, moved)
    print(f"\ndevice memory before / after offload (bytes): {freed}")
    assert all(after < before / 4 for before, after in freed)
