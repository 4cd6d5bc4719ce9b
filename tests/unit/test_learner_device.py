"""Device, backend and memory options of a learner rank, in-process (no Ray, no process group, no GPU).

The numerics of bf16 and activation checkpointing over 2 ranks are in test_learner_precision.py; CUDA itself
in tests/gpu.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from toolbox.learner.config import LearnerConfig
from toolbox.learner.strategy import (
    Placement,
    backend_for,
    enable_activation_checkpointing,
    peak_memory_gb,
    resolve_device,
    wrap,
)
from toolbox.models.loading import load_causal_lm

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


def test_backend_follows_the_device() -> None:
    assert backend_for("auto", CPU) == "gloo"
    # nccl for device tensors, gloo for the host-side metric reductions every learner makes.
    assert backend_for("auto", GPU) == backend_for("nccl", GPU) == "cuda:nccl,cpu:gloo"
    assert backend_for("gloo", GPU) == "gloo"
    with pytest.raises(ValueError, match="learner.backend: nccl needs learner.device: cuda"):
        backend_for("nccl", CPU)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_device_without_a_gpu() -> None:
    assert resolve_device("auto") == resolve_device("cpu") == CPU
    with pytest.raises(RuntimeError, match=r"learner.device is 'cuda' but .* learner.gpus_per_worker"):
        resolve_device("cuda")
    with pytest.raises(RuntimeError, match=r"rollout.engine.device is 'cuda' .* rollout.gpus_per_worker"):
        resolve_device("cuda", "rollout.engine.device")


@pytest.mark.parametrize(("field", "value"), [("mixed_precision", "bf16"), ("offload", "optimizer")])
def test_fsdp2_only_options_are_refused_elsewhere(field: str, value: str) -> None:
    LearnerConfig(strategy="fsdp2", **{field: value})
    with pytest.raises(ValidationError, match=rf"learner.{field}: '{value}' needs learner.strategy fsdp2"):
        LearnerConfig(strategy="ddp", num_workers=2, **{field: value})


def test_activation_checkpointing_needs_a_transformers_model() -> None:
    with pytest.raises(ValueError, match="learner.activation_checkpointing: Sequential is not a transformers model"):
        enable_activation_checkpointing(nn.Sequential(nn.Linear(2, 2)))


def test_single_rank_checkpointing_keeps_names_and_gradients(tiny_model_dir: Path) -> None:
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])

    def grads(checkpointing: bool) -> tuple[list[str], list[torch.Tensor]]:
        model = wrap(load_causal_lm(str(tiny_model_dir)).train(), "single", Placement(CPU, "fp32", checkpointing))
        flag = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else \
            "is_gradient_checkpointing"  # the name before transformers 5.2x
        assert getattr(model, flag) is checkpointing
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return [n for n, _ in model.named_parameters()], [p.grad for p in model.parameters()]

    (names, plain), (ckpt_names, ckpt) = grads(False), grads(True)
    assert ckpt_names == names  # no wrapper prefix: export and checkpoints see the same names
    assert all(torch.equal(a, b) for a, b in zip(plain, ckpt))


def test_peak_memory_is_reported_on_cpu() -> None:
    assert 0 < peak_memory_gb(CPU) < 1024
