"""Drive an online learner in-process the way the driver and `LearnerWorker` do: `plan` on rank 0, then
`update` with only the shards the plan assigns (one rank here)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


def online_step(learner: Any, shards: list[RolloutBatch], results: list[RewardResult],
                keep_groups: list[int] | None = None) -> dict[str, float]:
    """``learner.plan`` then ``learner.update`` with the shards rank 0 is told to fetch."""
    plan = learner.plan(shards, results, keep_groups)
    return learner.update(plan, {i: shards[i] for i in plan.shards_for(0)})


def spawn_two_gloo_ranks(fn: Callable[..., None], model_dir: str | Path, out: Path) -> None:
    """``fn(rank, model_dir, init_method, out)`` in two spawned processes that meet through a fresh rendezvous file.

    A file, not a free TCP port: a port found free and released before the ranks bind can be taken in between
    by another process on a busy machine (seen: EADDRINUSE)."""
    rendezvous = Path(tempfile.mkdtemp(prefix="gloo-")) / "rendezvous"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    mp.spawn(fn, args=(str(model_dir), f"file://{rendezvous}", str(out)), nprocs=2, join=True)
