"""Bucketed weight transfer: a state dict as buckets of raw byte arrays plus a manifest.

Each bucket is a manifest of (name, dtype, shape, nbytes) and one ``numpy.uint8``
array per tensor, each a zero-copy view of the tensor's memory. Put in Ray's object
store, a bucket becomes one object whose arrays Ray lays out contiguously in shared
memory (pickle protocol 5 out-of-band buffers): the put is the one and only copy on
the sender. The receiver gets read-only views into that shared memory,
`unpack_bucket` reinterprets them as torch tensors (no copy), and `load_into`
points the rollout model's parameters at them, so the receiver copies nothing on
CPU. NumPy has no bfloat16, which is why arrays are raw bytes and the dtype lives
in the manifest. Tensors are not packed into one flat buffer per bucket: that is one
more full copy on the sender, at half the throughput (`toolbox bench weight_sync`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of one tensor in a bucket."""

    name: str
    dtype: str  # e.g. "float32", "bfloat16"
    shape: tuple[int, ...]
    nbytes: int


@dataclass
class WeightBucket:
    """Tensors as raw byte arrays, and the manifest that says how to read them."""

    manifest: list[TensorSpec]
    arrays: list[np.ndarray]  # uint8, 1-D, one per manifest entry
    # LoRA adapter weights alone (learner.lora.sync: adapter): the LoRA config (`toolbox.learner.lora.LoraConfig`
    # as a dict) an engine needs to apply them; None for full model weights.
    adapter: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)

    @property
    def shared(self) -> bool:
        """True when the arrays are read-only views into the object store (nothing here owns them)."""
        return all(not a.flags.writeable for a in self.arrays)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight manifest")
    return dtype


def _as_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A uint8 view of a CPU tensor's memory (a copy only if it is not contiguous or on another device)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def pack_state_dict(state: Mapping[str, torch.Tensor], bucket_bytes: int = 256 << 20) -> list[WeightBucket]:
    """Group tensors into buckets of about ``bucket_bytes`` (a larger tensor gets its own bucket)."""
    buckets: list[WeightBucket] = [WeightBucket([], [])]
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if buckets[-1].arrays and buckets[-1].nbytes + nbytes > bucket_bytes:
            buckets.append(WeightBucket([], []))
        dtype = str(tensor.dtype).removeprefix("torch.")
        buckets[-1].manifest.append(TensorSpec(name, dtype, tuple(tensor.shape), nbytes))
        buckets[-1].arrays.append(_as_bytes(tensor))
    return [b for b in buckets if b.arrays]


def unpack_bucket(bucket: WeightBucket) -> dict[str, torch.Tensor]:
    """Tensors that are views of the bucket's arrays (no copy).

    The arrays may be read-only (Ray's zero-copy arrays are); such views must only
    be read, e.g. as the source of ``param.copy_`` or as inference weights.
    """
    out = {}
    for spec, array in zip(bucket.manifest, bucket.arrays):
        if spec.nbytes == 0:  # torch gives an empty array stride 0, which it cannot view as another dtype
            out[spec.name] = torch.empty(spec.shape, dtype=_dtype(spec.dtype))
            continue
        with warnings.catch_warnings():
            # torch warns that it cannot protect a read-only array; we only ever read it.
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(array)
        out[spec.name] = raw.view(_dtype(spec.dtype)).view(spec.shape)
    return out


def unpack_all(buckets: Iterable[WeightBucket]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        out.update(unpack_bucket(bucket))
    return out


@torch.no_grad()
def load_into(model: torch.nn.Module, buckets: Iterable[WeightBucket]) -> int:
    """Load bucket tensors into ``model`` by name; returns the bytes loaded.

    Where the object store allows it (a shared, read-only bucket whose tensor matches
    the parameter's dtype and device), the parameter is re-pointed at the bucket's
    memory instead of copied: a rollout model only reads its weights, and the view
    keeps the shared buffer alive until the next sync replaces it. Otherwise the
    tensor is copied (always, for buckets that are views of a live learner in the
    same process). Fails loudly on a missing or misshapen tensor rather than
    loading half a model.
    """
    # state_dict(keep_vars=True) also lists tied aliases (lm_head.weight = embed_tokens.weight).
    targets = model.state_dict(keep_vars=True)
    aliased: set[str] = model.__dict__.setdefault("_toolbox_aliased", set())
    loaded, seen = 0, set()
    for bucket in buckets:
        shared = bucket.shared
        for name, src in unpack_bucket(bucket).items():
            if name not in targets:
                raise KeyError(f"weight {name!r} from the learner has no counterpart in the rollout model")
            dst = targets[name]
            if dst.shape != src.shape:
                raise ValueError(f"weight {name!r}: learner shape {tuple(src.shape)} != rollout shape {tuple(dst.shape)}")
            if shared and dst.dtype == src.dtype and dst.device == src.device:
                dst.data = src
                aliased.add(name)
            elif name in aliased:  # never write into a shared, read-only buffer
                dst.data = src.to(dst.dtype).clone()
                aliased.discard(name)
            else:
                dst.copy_(src)
            loaded += src.numel() * src.element_size()
            seen.add(name)
    missing = set(dict(model.named_parameters())) - seen
    if missing:
        raise KeyError(f"learner sent no weights for {sorted(missing)[:5]} ({len(missing)} missing)")
    return loaded
