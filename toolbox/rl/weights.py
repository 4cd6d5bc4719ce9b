"""Bucketed weight transfer: a state dict packed into flat contiguous byte buffers.

Each bucket is one ``numpy.uint8`` array plus a manifest of (name, dtype, shape,
offset). NumPy arrays travel through Ray's object store without a copy: the
receiver gets a read-only view into shared memory, and `unpack_bucket` reinterprets
it as torch tensors (views, no copy), so the only copy on the receiving side is the
one into the model's own parameters. NumPy has no bfloat16, which is why buffers
are raw bytes and the dtype lives in the manifest.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

ALIGN = 64  # bytes; keeps every tensor's view aligned for vectorised copies


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lives inside a bucket."""

    name: str
    dtype: str  # e.g. "float32", "bfloat16"
    shape: tuple[int, ...]
    offset: int  # bytes from the bucket start
    nbytes: int


@dataclass
class WeightBucket:
    """A flat byte buffer and the manifest that says how to read it."""

    manifest: list[TensorSpec]
    buffer: np.ndarray  # uint8, 1-D

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight manifest")
    return dtype


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def pack_state_dict(state: Mapping[str, torch.Tensor], bucket_bytes: int = 256 << 20) -> list[WeightBucket]:
    """Pack tensors into buckets of about ``bucket_bytes`` each (a larger tensor gets its own bucket)."""
    groups: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, tensor in state.items():
        nbytes = _aligned(tensor.numel() * tensor.element_size())
        if groups[-1] and size + nbytes > bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, tensor))
        size += nbytes
    return [_pack(group) for group in groups if group]


def _pack(items: list[tuple[str, torch.Tensor]]) -> WeightBucket:
    manifest, offset = [], 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        manifest.append(TensorSpec(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, nbytes))
        offset += _aligned(nbytes)
    buffer = np.empty(offset, dtype=np.uint8)
    flat = torch.from_numpy(buffer)
    for spec, (_, tensor) in zip(manifest, items):
        src = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        flat[spec.offset : spec.offset + spec.nbytes].copy_(src)
    return WeightBucket(manifest, buffer)


def unpack_bucket(bucket: WeightBucket) -> dict[str, torch.Tensor]:
    """Tensors that are views into ``bucket.buffer`` (no copy).

    The buffer may be read-only (Ray's zero-copy arrays are); the views must then
    only be read, e.g. as the source of ``param.copy_``.
    """
    with warnings.catch_warnings():
        # torch warns that it cannot protect a read-only array; we only ever read it.
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(bucket.buffer)
    out = {}
    for spec in bucket.manifest:
        raw = flat[spec.offset : spec.offset + spec.nbytes]
        out[spec.name] = raw.view(_dtype(spec.dtype)).view(spec.shape)
    return out


def unpack_all(buckets: Iterable[WeightBucket]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        out.update(unpack_bucket(bucket))
    return out


@torch.no_grad()
def load_into(model: torch.nn.Module, buckets: Iterable[WeightBucket]) -> int:
    """Copy bucket tensors into ``model``'s parameters and buffers by name; returns bytes copied.

    Fails loudly on a missing or misshapen tensor rather than loading half a model.
    """
    # state_dict(keep_vars=True) also lists tied aliases (lm_head.weight = embed_tokens.weight).
    targets = model.state_dict(keep_vars=True)
    copied, seen = 0, set()
    for bucket in buckets:
        for name, src in unpack_bucket(bucket).items():
            if name not in targets:
                raise KeyError(f"weight {name!r} from the learner has no counterpart in the rollout model")
            dst = targets[name]
            if dst.shape != src.shape:
                raise ValueError(f"weight {name!r}: learner shape {tuple(src.shape)} != rollout shape {tuple(dst.shape)}")
            dst.copy_(src)
            copied += src.numel() * src.element_size()
            seen.add(name)
    missing = set(dict(model.named_parameters())) - seen
    if missing:
        raise KeyError(f"learner sent no weights for {sorted(missing)[:5]} ({len(missing)} missing)")
    return copied
