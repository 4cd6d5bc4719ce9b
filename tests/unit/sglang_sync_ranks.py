"""Rank functions of the SGLang-wire tests, in a module of their own: spawned ranks import only this (torch and
`toolbox.engines.nccl_sync`), not the test modules' other imports.

- `fake_wire_rank` (CI, no sglang): learner rank 0 sends over the sglang wire to rank 1, a bare receiver, in one gloo
  group; SGLang's two helpers are stand-ins (``init_custom_process_group`` hands back that group and records what it
  was asked; ``FlattenedTensorBucket`` concatenates byte views, as SGLang's does).
- `real_learner_rank` (the engine-contracts venv): learner rank 0 with SGLang's real helpers, joining a group with
  SGLang's real weight updater in the test process.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.distributed as dist

from toolbox.engines.nccl_sync import NcclSyncInit, NcclWeightSender, plan_buckets, weight_manifest

BUFFER_BYTES = 40  # a few buckets for the tiny model below, and one tensor (20 floats) larger than a bucket


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3, bias=False))


def _fake_sglang(joined: list) -> None:
    class FlattenedTensorBucket:
        def __init__(self, named_tensors: list) -> None:
            self.flat = torch.cat([t.flatten().view(torch.uint8) for _, t in named_tensors])

        def get_flattened_tensor(self) -> torch.Tensor:
            return self.flat

    def init_custom_process_group(**kwargs: object) -> object:
        joined.append(kwargs)
        return dist.group.WORLD

    utils = types.ModuleType("sglang.srt.utils")
    utils.init_custom_process_group = init_custom_process_group  # type: ignore[attr-defined]
    bucket = types.ModuleType("sglang.srt.weight_sync.tensor_bucket")
    bucket.FlattenedTensorBucket = FlattenedTensorBucket  # type: ignore[attr-defined]
    for name in ("sglang", "sglang.srt", "sglang.srt.weight_sync"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules[utils.__name__], sys.modules[bucket.__name__] = utils, bucket


def receive_buckets(manifest: list, group: object = None) -> list[tuple[str, torch.Tensor]]:
    """What an engine receives over the sglang wire: per `plan_buckets` bucket one flat byte broadcast, cut back into
    the announced tensors."""
    received = []
    for bucket in plan_buckets(manifest, BUFFER_BYTES):
        specs = [manifest[k] for k in bucket]
        flat = torch.empty(sum(s.nbytes for s in specs), dtype=torch.uint8)
        dist.broadcast(flat, src=0, group=group)
        offset = 0
        for s in specs:
            received.append((s.name, flat[offset:offset + s.nbytes].view(getattr(torch, s.dtype)).view(s.shape)))
            offset += s.nbytes
    return received


def fake_wire_rank(rank: int, _model_dir: str, out: str) -> None:
    if rank == 0:
        joined: list = []
        _fake_sglang(joined)
        sender = NcclWeightSender(tiny_model(), 0, torch.device("cpu"))
        sender.open(NcclSyncInit("127.0.0.1", 1, 2, BUFFER_BYTES, wire="sglang", backend="gloo"))
        nbytes = sender.send()
        torch.save({"joined": joined, "bytes": nbytes}, f"{out}.0")
    else:
        torch.save({"received": receive_buckets(weight_manifest(tiny_model()))}, f"{out}.1")


def real_learner_rank(address: str, port: int, store_file: str, out: str) -> None:
    """Learner rank 0 as in a run: its own default group (the learner's, here of one rank), then SGLang's
    weight-update group with the engine, one round sent."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=0, world_size=1)
    try:
        sender = NcclWeightSender(tiny_model(), 0, torch.device("cpu"))
        sender.open(NcclSyncInit(address, port, 2, BUFFER_BYTES, wire="sglang", backend="gloo"))
        torch.save({"bytes": sender.send()}, out)
        sender.close()
    finally:
        dist.destroy_process_group()
