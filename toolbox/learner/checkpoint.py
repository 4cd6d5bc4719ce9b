"""Checkpoints through ``torch.distributed.checkpoint``: model, optimizer, scheduler, step and RNG.

Model and optimizer go into one DCP checkpoint (sharded: each rank writes its
shards, and a resume may use another world size). Step, scheduler and RNG states
are small per-rank files beside it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from toolbox.core.seeding import rng_state, set_rng_state
from toolbox.learner.strategy import is_distributed, unwrap


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns on every save/load without a process group; one rank ('single') is a supported setup."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank() -> int:
    return torch.distributed.get_rank() if is_distributed() else 0


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, Any]) -> Path:
    """Write a checkpoint to ``path`` (a directory). Collective: every rank calls it."""
    model_sd, optim_sd = get_state_dict(unwrap(model), optimizer)
    with _quiet_single_process():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    torch.save({**extra, "rng": rng_state()}, path / f"extra_rank{_rank()}.pt")
    return path


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model and optimizer in place; return this rank's extra state (step, scheduler, ...)."""
    if not (path / ".metadata").exists():
        raise FileNotFoundError(f"no checkpoint at {path} (missing .metadata); pass a step_* directory")
    model_sd, optim_sd = get_state_dict(unwrap(model), optimizer)
    with _quiet_single_process():
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))  # loads in place
    set_state_dict(unwrap(model), optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    extra_file = path / f"extra_rank{_rank()}.pt"
    if not extra_file.exists():  # resuming with more ranks than saved: rank 0's step is everyone's
        extra_file = path / "extra_rank0.pt"
    extra = torch.load(extra_file, weights_only=False)
    set_rng_state(extra.pop("rng"))
    return extra


def load_model_weights(path: Path, model: nn.Module) -> None:
    """Only the model part of a checkpoint, into a plain (unwrapped) ``model`` on one process without a process group.

    DCP reshards on load, so a checkpoint written by any number of ranks (FSDP2 shards, DDP
    replicas) loads here; the optimizer state in it is not read.
    """
    if not (path / ".metadata").exists():
        raise FileNotFoundError(f"no checkpoint at {path} (missing .metadata); pass a run directory or a step_* directory")
    model_sd = get_model_state_dict(model)
    with _quiet_single_process():
        dcp.load({"model": model_sd}, checkpoint_id=str(path))
    set_model_state_dict(model, model_sd)
