"""Drive an online learner in-process the way the driver and `LearnerWorker` do: `plan` on rank 0, then
`update` with only the shards the plan assigns (one rank here)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


def online_step(learner: Any, shards: list[RolloutBatch], results: list[RewardResult],
                keep_groups: list[int] | None = None) -> dict[str, float]:
    """``learner.plan`` then ``learner.update`` with the shards rank 0 is told to fetch."""
    plan = learner.plan(shards, results, keep_groups)
    return learner.update(plan, {i: shards[i] for i in plan.shards_for(0)})


# How far one Adam step of two ranks may land from one rank's. Adam's first step moves a weight by lr * g / (|g| + eps):
# about lr (1e-3 in these tests) wherever |g| >> eps, but a gradient within a few eps of zero, summed across ranks in
# another order, moves by a visible fraction of lr (4e-5 measured on an AVX2 CPU for one weight of the GPT's 16384).
# A wrong shard or a lost rank moves whole tensors by about lr.
SAME_UPDATE_ATOL = 1e-4


def assert_same_update(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Every tensor of ``want`` (one rank's state after a step) in ``got`` (two ranks'), within `SAME_UPDATE_ATOL`."""
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=SAME_UPDATE_ATOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


# What every rank imports, imported once into the fork server each rank is forked from (a spawned rank imports
# torch and transformers itself: about 3 CPU s per rank).
PRELOAD = ["tests.unit.learner_steps", "transformers.modeling_utils", "torch.distributed.fsdp",
           "torch.distributed.checkpoint"]


def spawn_two_gloo_ranks(fn: Callable[[int, str, str], None], model_dir: str | Path, out: Path) -> None:
    """``fn(rank, model_dir, out)`` in two processes, each rank of one gloo group (one thread each) that meets
    through a fresh rendezvous file.

    The ranks fork from multiprocessing's fork server, which has imported `PRELOAD` once per test process: like
    spawned ones they share no state with this process (no Ray, no threads), and they get this process's
    environment as it is now (the server's is the one it started with).

    A file, not a free TCP port: a port found free and released before the ranks bind can be taken in between
    by another process on a busy machine (seen: EADDRINUSE)."""
    rendezvous = Path(tempfile.mkdtemp(prefix="gloo-")) / "rendezvous"
    env = {"TOKENIZERS_PARALLELISM": "false", **os.environ}
    mp.get_context("forkserver").set_forkserver_preload(PRELOAD)  # read when the server starts (the first call)
    mp.start_processes(_gloo_rank, args=(fn, str(model_dir), f"file://{rendezvous}", str(out), env), nprocs=2,
                       join=True, start_method="forkserver")


def _gloo_rank(rank: int, fn: Callable[[int, str, str], None], model_dir: str, init_method: str, out: str,
               env: dict[str, str]) -> None:
    """Run ``fn`` as one rank, then leave without gloo's teardown.

    Both ranks pass a barrier and exit with ``os._exit(0)``: destroying the group or running the interpreter's
    exit aborted a rank now and then in CI ("terminate called without an active exception", SIGABRT) after the
    test's work was done and written. A rank whose ``fn`` raises leaves through ``mp.start_processes``, which
    reports it."""
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2)
    fn(rank, model_dir, out)
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
