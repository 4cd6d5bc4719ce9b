"""The rank function of tests/unit/test_nccl_sync.py, in a module of its own: spawned ranks import only this (torch
and `toolbox.engines.nccl_sync`), not the test module's Ray-side imports."""

from __future__ import annotations

import sys
import types

import torch

from toolbox.engines.nccl_sync import NcclSyncInit, NcclWeightSender


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3, bias=False))


def _fake_vllm_producer(sent: list) -> None:
    """vLLM's packed producer as this test needs it: consume the (checked) pairs in order, record them."""
    packed = types.ModuleType("vllm.distributed.weight_transfer.packed_tensor")

    def producer(iterator, group, src, post_iter_func, buffer_size_bytes, num_buffers):  # noqa: ANN001, ANN202
        sent.extend((name, post_iter_func((name, t)).clone()) for name, t in iterator)

    packed.packed_nccl_broadcast_producer = producer  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.distributed", "vllm.distributed.weight_transfer"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules[packed.__name__] = packed


def fsdp2_send_rank(rank: int, _model_dir: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = tiny_model()
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    assert isinstance(model.state_dict()["0.weight"], torch.distributed.tensor.DTensor)
    sent: list = []
    _fake_vllm_producer(sent)
    sender = NcclWeightSender(model, rank, torch.device("cpu"))
    sender.init = NcclSyncInit("h", 1, 2, buffer_bytes=64)  # open() needs CUDA; the group is vLLM's
    nbytes = sender.send()
    torch.save({"sent": sent, "bytes": nbytes, "manifest": sender.manifest}, f"{out}.{rank}")


