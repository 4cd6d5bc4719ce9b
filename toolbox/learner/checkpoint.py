"""Checkpoints through ``torch.distributed.checkpoint``: model, optimizer, scheduler, step and RNG.

Model and optimizer go into one DCP checkpoint (sharded: each rank writes its
shards, and a resume may use another world size). Step, scheduler and RNG states
are small per-rank files beside it. A checkpoint's location is a local directory
or a URL of an fsspec filesystem (``s3://...``): each rank then writes its shards
and its own small file straight to the store (DCP's `FsspecWriter`) and reads
them back from it (`FsspecReader`), so no rank needs a disk the others share.
"""

from __future__ import annotations

import contextlib
import io
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
from toolbox.core.storage import has_file, is_remote, read_file, write_file
from toolbox.learner.strategy import is_distributed, unwrap


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns on every save/load without a process group; one rank ('single') is a supported setup."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank() -> int:
    return torch.distributed.get_rank() if is_distributed() else 0


def _storage(location: str, write: bool) -> dict[str, Any]:
    """DCP's arguments for ``location``: a local directory by its path, a URL through DCP's fsspec writer or reader.
    Without ``sync_files``: the fsspec writer would fall back to ``os.sync()`` of the whole local machine, while an
    object store's upload is durable once it is closed."""
    if not is_remote(location):
        return {"checkpoint_id": location}
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    if write:
        return {"storage_writer": FsspecWriter(location, sync_files=False)}
    return {"storage_reader": FsspecReader(location)}


def _check_exists(location: str, hint: str) -> None:
    if not has_file(location, ".metadata"):
        raise FileNotFoundError(f"no checkpoint at {location} (missing .metadata); pass {hint}")


def save_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    extra: dict[str, Any]) -> str:
    """Write a checkpoint to ``path`` (a directory or a URL). Collective: every rank calls it."""
    location = str(path)
    model_sd, optim_sd = get_state_dict(unwrap(model), optimizer)
    with _quiet_single_process():
        dcp.save({"model": model_sd, "optim": optim_sd}, **_storage(location, write=True))
    buffer = io.BytesIO()
    torch.save({**extra, "rng": rng_state()}, buffer)
    write_file(location, f"extra_rank{_rank()}.pt", buffer.getvalue())
    return location


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model and optimizer in place from ``path`` (a directory or a URL); return this rank's extra state
    (step, scheduler, ...)."""
    location = str(path)
    _check_exists(location, "a step_* directory")
    model_sd, optim_sd = get_state_dict(unwrap(model), optimizer)
    with _quiet_single_process():
        dcp.load({"model": model_sd, "optim": optim_sd}, **_storage(location, write=False))  # loads in place
    set_state_dict(unwrap(model), optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    # resuming with more ranks than saved: rank 0's step is everyone's
    data = read_file(location, f"extra_rank{_rank()}.pt") or read_file(location, "extra_rank0.pt")
    if data is None:
        raise FileNotFoundError(f"checkpoint {location} has no extra_rank{_rank()}.pt nor extra_rank0.pt")
    extra = torch.load(io.BytesIO(data), weights_only=False)
    set_rng_state(extra.pop("rng"))
    return extra


def load_model_weights(path: str | Path, model: nn.Module) -> None:
    """Only the model part of a checkpoint, into a plain (unwrapped) ``model`` on one process without a process group.

    DCP reshards on load, so a checkpoint written by any number of ranks (FSDP2 shards, DDP
    replicas) loads here; the optimizer state in it is not read.
    """
    location = str(path)
    _check_exists(location, "a run directory or a step_* directory")
    model_sd = get_model_state_dict(model)
    with _quiet_single_process():
        dcp.load({"model": model_sd}, **_storage(location, write=False))
    set_model_state_dict(model, model_sd)
