"""The payload of the vllm engine's ``ipc`` weight transfer: each bucket's tensors copied onto every GPU this process
shares with vLLM (cast to the engine's dtype) and handed over as CUDA IPC handles, one ``{gpu uuid:
rebuild_cuda_tensor args}`` dict per tensor, in the fields of vLLM's ``IPCWeightTransferUpdateInfo``. The caller
holds the copies until vLLM's workers have loaded them (`toolbox.engines.vllm.VLLMEngine.update_weights`)."""

from __future__ import annotations

from typing import Any

import torch

from toolbox.engines.common import (
    wire_dtype,
)


def ipc_update_info(tensors: dict[str, torch.Tensor], handles: list[dict[str, tuple]]) -> dict[str, Any]:
    """The fields of vLLM's ``IPCWeightTransferUpdateInfo`` for one bucket (unpacked: one handle dict per tensor)."""
    return {
        "names": list(tensors),
        "dtype_names": [str(t.dtype).removeprefix("torch.") for t in tensors.values()],
        "shapes": [list(t.shape) for t in tensors.values()],
        "ipc_handles": handles,
    }


def share_on_gpus(tensors: dict[str, torch.Tensor],
                   dtype: torch.dtype) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], list[dict[str, tuple]]]:
    """Copy each tensor onto every visible GPU, floating-point ones cast to ``dtype``; returns every copy, the first
    GPU's copy of each tensor by name (what the update announces) and, per tensor, ``{gpu uuid: rebuild_cuda_tensor
    args}``.

    vLLM's IPC receiver looks up its own GPU's UUID, so with tensor parallelism every worker's GPU needs its
    own copy. ``reduce_tensor`` returns ``(rebuild_cuda_tensor, args)``; the receiver wants ``args`` alone. The
    args do not keep the storage alive: the caller holds the copies until the receivers have loaded them.
    """
    from torch.multiprocessing.reductions import reduce_tensor

    devices = range(torch.cuda.device_count())
    uuids = [str(torch.cuda.get_device_properties(d).uuid) for d in devices]
    copies: dict[str, torch.Tensor] = {}
    handles: list[dict[str, tuple]] = []
    keep: list[torch.Tensor] = []
    for name, tensor in tensors.items():
        per_gpu = {}
        for d, uuid in zip(devices, uuids):
            copy = _gpu_copy(tensor, d, dtype)
            copies.setdefault(name, copy)
            keep.append(copy)
            _rebuild, args = reduce_tensor(copy)
            per_gpu[uuid] = args
        handles.append(per_gpu)
    torch.cuda.synchronize()
    return keep, copies, handles


def _gpu_copy(tensor: torch.Tensor, device: int, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous copy of ``tensor`` on ``cuda:device``, cast there to ``dtype`` when floating point (the seam
    the CPU contract tests replace)."""
    return tensor.to(f"cuda:{device}").to(wire_dtype(tensor, dtype)).contiguous()
