"""Device-to-device weight sync over NCCL: learner rank 0 broadcasts the full weights to every engine worker.

Two wires, one per engine (`NcclSyncInit.wire`); the learner's side (every rank walks the weights, rank 0 checks each
tensor against the manifest and broadcasts) and the driver's (`toolbox.actors.device_sync`) are the same for both.

**vLLM** (``wire="vllm"``): vLLM 0.33's own ``nccl`` weight-transfer backend
(``vllm/distributed/weight_transfer/nccl_engine.py``):

- **Group.** One NCCL group outside ``torch.distributed``'s default one (vLLM's ``StatelessProcessGroup`` +
  ``PyNcclCommunicator``): rank 0 is learner rank 0, ranks ``1 ..`` are the engines' workers (``rank_offset`` of
  rollout worker i = 1 + the tensor-parallel sizes of the engines before it). The learner side opens it with
  ``nccl_common.trainer_init``, each engine with ``LLM.init_weight_transfer_engine`` (`NcclSyncInit.worker_info`);
  both must enter concurrently (the driver issues them as concurrent Ray calls, `toolbox.actors.device_sync`).
- **Announcement.** Names, dtypes and shapes (`weight_manifest`, vLLM's ``NCCLWeightTransferUpdateInfo``) are
  known before any byte moves: the engines receive them once at open and pass them to each ``update_weights``.
- **Buckets.** ``packed``: vLLM's ``packed_nccl_broadcast_producer`` / ``_consumer`` cut the stream into chunks of
  ``learner.bucket_mb`` (double-buffered, two CUDA streams); both sides cut at the same tensor because they walk
  the same manifest, which is why `NcclWeightSender.send` checks every tensor against it.
- **A round.** engine: ``start_weight_update`` -> ``update_weights`` (receives and loads chunk by chunk) ->
  ``finish_weight_update``; learner: every rank waits for its device (the optimizer step), walks the weights
  (FSDP2 shards are gathered with ``DTensor.full_tensor()``, a collective, one tensor at a time), rank 0 casts
  floating-point tensors to the engines' dtype (`NcclSyncInit.dtype`, announced in the manifest) and broadcasts each chunk from its GPU. Nothing goes
  through host memory or Ray's object store.

**SGLang** (``wire="sglang"``): SGLang 0.5.23's distributed weight update. The group is a ``torch.distributed``
process group of its own, made on both sides by SGLang's ``init_custom_process_group`` (TCP rendezvous at
learner rank 0's address, store prefixed with the group name): the learner calls it directly, each engine through
``Engine.init_weights_update_group(master_address, master_port, rank_offset, world_size, group_name, backend)``.
A round is cut into buckets of at most ``learner.bucket_mb`` by `plan_buckets` (both sides, from the manifest);
per bucket rank 0 broadcasts one flat byte tensor (SGLang's ``FlattenedTensorBucket`` layout) while the engine's
``update_weights_from_distributed(names, dtypes, shapes, group_name, flush_cache, load_format="flattened_bucket")``
receives it and loads it, inside one ``begin_weight_update`` / ``end_weight_update`` session.

The learner side needs the engine's package importable (it runs in the engine's image, as the engines do) and,
with ``backend="nccl"``, CUDA; without them `NcclWeightSender.open` raises and says so. Not here: the decision to
use it (`toolbox.engines.placement.choose_sync_path`), the Ray calls (`toolbox.actors.device_sync`), the engine
side (``open_device_sync`` / ``receive_weights`` of `toolbox.engines.vllm.VLLMEngine` and
`toolbox.engines.sglang.SGLangEngine`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from toolbox.rl.weights import TensorSpec

PACKED_NUM_BUFFERS = 2  # vLLM's DEFAULT_PACKED_NUM_BUFFERS: double buffering on two CUDA streams
SGLANG_GROUP = "toolbox_weight_sync"  # the group name SGLang's engines and learner rank 0 meet under
Wire = Literal["vllm", "sglang"]


@dataclass(frozen=True)
class NcclSyncInit:
    """Where the NCCL group meets (learner rank 0's node and a free port there) and its wire parameters."""

    master_address: str
    master_port: int
    world_size: int  # 1 (learner rank 0) + every worker of every engine
    buffer_bytes: int  # one packed chunk / bucket (learner.bucket_mb); both sides must agree
    num_buffers: int = PACKED_NUM_BUFFERS
    wire: Wire = "vllm"  # whose receiver the engines run
    backend: str = "nccl"  # sglang wire: the torch.distributed backend (gloo only in the CPU contract tests)
    dtype: str = ""  # the engines' dtype, which floating-point weights are cast to on rank 0; "": as they are

    def trainer_info(self) -> dict[str, Any]:
        """What vLLM's ``nccl_common.trainer_init`` reads (the learner side is NCCL rank 0)."""
        return {"master_address": self.master_address, "master_port": self.master_port, "world_size": self.world_size}

    def worker_info(self, rank_offset: int) -> dict[str, Any]:
        """What an engine whose first worker is NCCL rank ``rank_offset`` (its tensor-parallel workers follow it)
        joins with: vLLM's ``NCCLWeightTransferInitInfo`` fields, or SGLang's ``init_weights_update_group`` arguments
        plus ``buffer_bytes`` (the engine cuts its buckets with `plan_buckets`)."""
        if self.wire == "sglang":
            return {**self.trainer_info(), "rank_offset": rank_offset, "group_name": SGLANG_GROUP,
                    "backend": self.backend, "buffer_bytes": self.buffer_bytes}
        return {**self.trainer_info(), "rank_offset": rank_offset, "packed": True,
                "packed_buffer_size_bytes": self.buffer_bytes, "packed_num_buffers": self.num_buffers}


def plan_group(address: str, port: int, workers_per_engine: Sequence[int], buffer_bytes: int,
               wire: Wire = "vllm", dtype: str = "") -> tuple[NcclSyncInit, list[int]]:
    """The group's init and each engine's ``rank_offset``: learner rank 0 is rank 0, engine i's workers follow
    engine i-1's."""
    if not workers_per_engine or min(workers_per_engine) < 1:
        raise ValueError(f"nccl weight sync: every engine needs at least one worker, got {list(workers_per_engine)}")
    offsets = [1 + sum(workers_per_engine[:i]) for i in range(len(workers_per_engine))]
    return NcclSyncInit(address, port, 1 + sum(workers_per_engine), buffer_bytes, wire=wire, dtype=dtype), offsets


def plan_buckets(manifest: Sequence[TensorSpec], buffer_bytes: int) -> list[range]:
    """The SGLang wire's buckets: consecutive manifest entries, each bucket at most ``buffer_bytes`` (a larger tensor
    alone), and a new bucket wherever a tensor would start at a byte offset its dtype cannot be viewed at (SGLang's
    receiver refuses an unaligned offset). Learner and engines both cut from the manifest, so they agree."""
    buckets: list[range] = []
    start, size = 0, 0
    for k, spec in enumerate(manifest):
        itemsize = getattr(torch, spec.dtype).itemsize
        if k > start and (size + spec.nbytes > buffer_bytes or size % itemsize):
            buckets.append(range(start, k))
            start, size = k, 0
        size += spec.nbytes
    if start < len(manifest):
        buckets.append(range(start, len(manifest)))
    return buckets


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict under the names the object-store export uses (DDP's wrapper removed). With FSDP2 the
    values are DTensors whose ``shape`` is the full one; nothing is gathered here."""
    from toolbox.learner.strategy import unwrap

    return unwrap(model).state_dict()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def weight_manifest(model: nn.Module, dtype: str = "") -> list[TensorSpec]:
    """Name, dtype, full shape and bytes of every tensor the sync sends, in the order it sends them; floating-point
    tensors in ``dtype`` (the engines') when given. The same on every learner rank, and without any communication."""
    specs = []
    for name, t in _state(model).items():
        sent = _wire_dtype(t, dtype)
        specs.append(TensorSpec(name, _dtype_name(sent), tuple(t.shape), math.prod(t.shape) * sent.itemsize))
    return specs


def _wire_dtype(tensor: torch.Tensor, dtype: str) -> torch.dtype:
    return getattr(torch, dtype) if dtype and tensor.is_floating_point() else tensor.dtype


def cast(pairs: Iterator[tuple[str, torch.Tensor]], dtype: str) -> Iterator[tuple[str, torch.Tensor]]:
    """``pairs`` with floating-point tensors in ``dtype`` (one at a time, on their device): an fp32 learner sends a
    bf16 engine half the bytes, and the engine loads what it keeps."""
    for name, tensor in pairs:
        yield name, tensor.to(_wire_dtype(tensor, dtype))


def update_info(manifest: Sequence[TensorSpec]) -> dict[str, Any]:
    """vLLM's ``NCCLWeightTransferUpdateInfo`` fields for ``manifest``."""
    return {"names": [s.name for s in manifest], "dtype_names": [s.dtype for s in manifest],
            "shapes": [list(s.shape) for s in manifest]}


def full_weights(model: nn.Module, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of the state dict, whole and on ``device``, one at a time. Collective under FSDP2: every rank
    must walk it to the end (``full_tensor()`` all-gathers one parameter); shards offloaded to the host
    (``learner.offload``) are moved to ``device`` first, so the gather runs on the device's (nccl) group."""
    for name, tensor in _state(model).items():
        tensor = tensor.detach()
        if tensor.device != device:
            tensor = tensor.to(device, non_blocking=True)
        gather = getattr(tensor, "full_tensor", None)
        yield name, (gather() if callable(gather) else tensor)


def checked(pairs: Iterator[tuple[str, torch.Tensor]], manifest: Sequence[TensorSpec]) -> Iterator[tuple[str, torch.Tensor]]:
    """``pairs``, each checked against the manifest the engines were given: the receivers size their buffers and cut
    their chunks from it, so a mismatch would hang NCCL or load garbage; here it is an error naming the tensor."""
    sent = 0
    for name, tensor in pairs:
        if sent >= len(manifest):
            raise ValueError(f"nccl weight sync: the learner has more tensors than the {len(manifest)} announced to "
                             f"the engines; first extra: {name!r}")
        spec = manifest[sent]
        if (name, _dtype_name(tensor.dtype), tuple(tensor.shape)) != (spec.name, spec.dtype, tuple(spec.shape)):
            raise ValueError(f"nccl weight sync: tensor {sent} is {name!r} {_dtype_name(tensor.dtype)} "
                             f"{tuple(tensor.shape)}, but the engines were told {spec.name!r} {spec.dtype} "
                             f"{tuple(spec.shape)}")
        sent += 1
        yield name, tensor if tensor.is_contiguous() else tensor.contiguous()
    if sent != len(manifest):
        raise ValueError(f"nccl weight sync: the learner sent {sent} tensors, {len(manifest)} were announced")


def sglang_weight_sync() -> tuple[Any, Any]:
    """SGLang's ``init_custom_process_group`` and ``FlattenedTensorBucket``; an error that says where they are needed
    when SGLang is not installed."""
    try:
        from sglang.srt.utils import init_custom_process_group
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
    except ImportError as err:
        raise RuntimeError("nccl weight sync: the learner joins SGLang's weight-update group and packs SGLang's "
                           "flattened buckets, so sglang must be importable in the learner's environment too (run "
                           "learner and engines from the SGLang image, docs/gpus.md)") from err
    return init_custom_process_group, FlattenedTensorBucket


def broadcast_buckets(pairs: Iterator[tuple[str, torch.Tensor]], buckets: Sequence[range], group: Any) -> None:
    """The SGLang wire's send: per bucket, the tensors flattened into one byte tensor (SGLang's own
    ``FlattenedTensorBucket``, so the layout is the receiver's) and broadcast from rank 0. ``pairs`` come
    `checked`, and are walked to their end so that a tensor too many is an error too."""
    import torch.distributed as dist

    flattened_bucket = sglang_weight_sync()[1]
    for bucket in buckets:
        named = [next(pairs) for _ in bucket]
        dist.broadcast(flattened_bucket(named_tensors=named).get_flattened_tensor(), src=0, group=group)
    for _ in pairs:
        pass


def vllm_weight_transfer() -> Any:
    """vLLM's weight-transfer package; an error that says where it is needed when vLLM is not installed."""
    try:
        from vllm.distributed import weight_transfer
    except ImportError as err:
        raise RuntimeError("nccl weight sync: the learner opens vLLM's NCCL weight-transfer group, so vllm must be "
                           "importable in the learner's environment too (run learner and engines from the vLLM "
                           "image, docs/gpus.md)") from err
    return weight_transfer


class NcclWeightSender:
    """The learner side of the sync. Every rank has one (all of them take part in the gathers); rank 0 holds the NCCL
    endpoint and broadcasts."""

    def __init__(self, model: nn.Module, rank: int, device: torch.device | None = None) -> None:
        """``device``: where the full tensors are gathered and sent from (default: this rank's current GPU)."""
        self.model, self.rank = model, rank
        if device is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.group: Any = None
        self.init: NcclSyncInit | None = None
        self.manifest = weight_manifest(model)

    def open(self, init: NcclSyncInit) -> None:
        """Rank 0 joins the group as NCCL rank 0 (blocks until every engine worker has joined too); other ranks
        only remember the init."""
        if init.backend == "nccl" and (self.device is None or self.device.type != "cuda"):
            raise RuntimeError(f"nccl weight sync: learner rank {self.rank} sees no GPU; the device-to-device sync "
                               f"needs the learner on cuda (learner.gpus_per_worker > 0)")
        self.init = init
        self.manifest = weight_manifest(self.model, init.dtype)  # what the engines were told (`announce`)
        if self.rank != 0:
            return
        if init.wire == "sglang":
            join = sglang_weight_sync()[0]
            self.group = join(backend=init.backend, init_method=f"tcp://{init.master_address}:{init.master_port}",
                              world_size=init.world_size, rank=0, group_name=SGLANG_GROUP)
            return
        vllm_weight_transfer()
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        self.group = trainer_init(init.trainer_info())

    def send(self) -> int:
        """One round: every rank walks the full weights (the gathers), rank 0 broadcasts them in packed chunks.
        Returns the bytes rank 0 sent (0 elsewhere). The engines' matching ``update_weights`` must be running."""
        if self.init is None or self.device is None:
            raise RuntimeError(f"nccl weight sync: learner rank {self.rank} sends before open()")
        # Every rank checks, without communicating, so that all of them stop together (rank 0 alone stopping would
        # leave the others waiting in a gather).
        if weight_manifest(self.model, self.init.dtype) != self.manifest:
            raise RuntimeError(f"nccl weight sync: learner rank {self.rank}'s weights no longer match the manifest "
                               f"announced to the engines at open (a changed model needs a new group)")
        if self.device.type == "cuda":
            # vLLM's producer packs and broadcasts on streams of its own, which do not wait for the optimizer step
            # queued on this rank's stream: without this the first chunks could carry half-updated parameters.
            torch.cuda.synchronize(self.device)
        pairs = cast(full_weights(self.model, self.device), self.init.dtype)
        if self.rank != 0:
            for _ in pairs:  # join each gather; rank 0 sends
                pass
        elif self.init.wire == "sglang":
            broadcast_buckets(checked(pairs, self.manifest), plan_buckets(self.manifest, self.init.buffer_bytes),
                              self.group)
        else:
            from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

            packed_nccl_broadcast_producer(iterator=checked(pairs, self.manifest), group=self.group, src=0,
                                           post_iter_func=lambda item: item[1], buffer_size_bytes=self.init.buffer_bytes,
                                           num_buffers=self.init.num_buffers)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the parameters may change once this returns
        return sum(s.nbytes for s in self.manifest) if self.rank == 0 else 0

    def close(self) -> None:
        if self.group is None:
            return
        if self.init is not None and self.init.wire == "sglang":
            import torch.distributed as dist

            dist.destroy_process_group(self.group)
        else:
            self.group.destroy()
        self.group = None

