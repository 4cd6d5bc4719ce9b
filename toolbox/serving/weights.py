"""The weight-update contract of ``POST /v1/toolbox/weights``: safetensors bytes in, a strict state-dict load.

The body is ``safetensors.torch.save(state_dict)`` of the full state dict, names as the model's own
``state_dict()``. `load_weights` raises `ValueError` with the missing / unexpected / mis-shaped names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
from safetensors.torch import load as load_safetensors
from torch import nn


def read_payload(payload: bytes) -> dict[str, torch.Tensor]:
    """The state dict in a request body; `ValueError` if it is not safetensors bytes."""
    try:
        return load_safetensors(payload)
    except Exception as err:  # safetensors raises its own SafetensorError for bad bytes
        raise ValueError(f"the body is not a safetensors file: {err}") from err


def load_weights(model: nn.Module, payload: bytes) -> int:
    """Load ``payload`` into ``model`` with ``strict=True``; the number of tensors loaded."""
    state = read_payload(payload)
    check_fits(model, state)  # before loading: load_state_dict copies what matches before it raises
    model.load_state_dict(state, strict=True)
    return len(state)


def check_fits(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Raise `ValueError` naming the missing, unexpected and mis-shaped tensors, so a bad push changes nothing."""
    own = model.state_dict()
    missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    shapes = sorted(f"{k}: {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in own.items()
                    if k in state and state[k].shape != v.shape)
    if missing or unexpected or shapes:
        raise ValueError(f"the state dict does not fit the served model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}, mis-shaped {shapes[:5]}")


def state_digest(model: nn.Module) -> str:
    """sha256 over every (name, dtype, shape, bytes) of ``model.state_dict()``, in name order."""
    return digest_of(model.state_dict())


def digest_of(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every (name, dtype, shape, bytes) of ``state``, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
