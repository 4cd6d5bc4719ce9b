"""Learner -> rollout weight sync throughput, beside a plain memcpy of the same bytes.

``python -m toolbox.bench weight_sync [--sizes-mb 100,1000] [--warmup 3] [--repeats 5]``

A sender actor packs its parameters into buckets and puts them in the object store
(exactly the learner's ``export_weights`` path); a receiver actor loads them with
``load_into`` (the rollout engine's path). The clock runs from the export call to
the receiver's return, seen from the driver, two ways, alternating within each round:
``chained`` as the online loop does it (the export's ref goes straight into the
receiver's one call, the driver waits once) and ``driver`` (the driver fetches the
bucket refs, then calls the receiver: one more round trip). ``ping`` is an empty actor
call's round trip, the fixed latency of one call. The memcpy baseline copies the same
bytes between two warm numpy buffers in one process, single-threaded, in the same
run. The object store is pre-faulted so both sides compare copies, not page faults.

Each process still faults in the pages of the shared memory it first writes or maps (the store's pre-faulting is
the store's own mapping): a learner's first syncs pay that, about 3x the steady sync at 100 MB (rounds of 96 MB:
39, 29, 28, then 9 ms from the fourth on). ``first sync s`` is the first round; the other columns are the best of
``--repeats`` rounds after ``--warmup`` untimed ones, the steady state of a run that syncs every step. Each size
runs on a Ray instance of its own whose store holds 3x its weights: on a store many times larger new objects keep
landing in pages the sender has not touched yet, and the steady state comes only once its writes have gone round
the store (96 MB on a 3 GB store: 0.18x memcpy after 8 rounds, 0.54-0.56x on a 300 MB one).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np
import torch

TENSOR_MB = 16


def make_module(total_mb: int, seed: int) -> torch.nn.Module:
    """Parameters of TENSOR_MB each adding up to ``total_mb`` (float32)."""
    gen = torch.Generator().manual_seed(seed)
    module = torch.nn.Module()
    numel = TENSOR_MB * (1 << 20) // 4
    for i in range(max(1, total_mb // TENSOR_MB)):
        module.register_parameter(f"p{i:04d}", torch.nn.Parameter(torch.randn(numel, generator=gen), requires_grad=False))
    return module


class Sender:
    """Holds weights like a learner rank and exports them as bucket refs."""

    def __init__(self, total_mb: int, bucket_mb: int) -> None:
        torch.set_num_threads(1)
        self.module, self.bucket_mb = make_module(total_mb, seed=1), bucket_mb

    def export(self) -> tuple[list[Any], float, float]:
        import ray

        from toolbox.rl.weights import pack_state_dict

        t0 = time.perf_counter()
        buckets = pack_state_dict(self.module.state_dict(), self.bucket_mb << 20)
        t1 = time.perf_counter()
        refs = [ray.put(b) for b in buckets]
        return refs, t1 - t0, time.perf_counter() - t1

    def checksum(self) -> float:
        return float(sum(p.double().sum() for p in self.module.parameters()))


class Receiver:
    """Holds weights like a rollout engine and loads bucket refs."""

    def __init__(self, total_mb: int) -> None:
        torch.set_num_threads(1)
        self.module = make_module(total_mb, seed=2)

    def load(self, exported: list[Any] | tuple[list[Any], float, float]) -> tuple[int, float]:
        """Load the bucket refs (``exported``: `Sender.export`'s refs, or its whole result when chained)."""
        import ray

        from toolbox.rl.weights import load_into

        refs = exported[0] if isinstance(exported, tuple) else exported
        t0 = time.perf_counter()
        loaded = load_into(self.module, ray.get(refs))
        return loaded, time.perf_counter() - t0

    def ping(self) -> None:
        return None

    def checksum(self) -> float:
        return float(sum(p.double().sum() for p in self.module.parameters()))


def memcpy_seconds(nbytes: int, repeats: int) -> float:
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # warm both buffers
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best


def measure(size_mb: int, repeats: int, bucket_mb: int, warmup: int = 3) -> dict[str, float]:
    import ray

    sender = ray.remote(Sender).options(num_cpus=0.5).remote(size_mb, bucket_mb)
    receiver = ray.remote(Receiver).options(num_cpus=0.5).remote(size_mb)
    ray.get([sender.checksum.remote(), receiver.checksum.remote()])
    best: dict[str, float] = {"sync_s": float("inf"), "driver_sync_s": float("inf"), "ping_s": float("inf")}
    for round_ in range(warmup + repeats):
        t0 = time.perf_counter()
        exported = sender.export.remote()
        _, load_s = ray.get(receiver.load.remote(exported))
        sync_s = time.perf_counter() - t0
        if round_ == 0:
            best["first_sync_s"] = sync_s
        if round_ < warmup:
            del exported
            continue
        if sync_s < best["sync_s"]:
            _, pack_s, put_s = ray.get(exported)
            best.update(sync_s=sync_s, pack_s=pack_s, put_s=put_s, load_s=load_s)
        del exported
        t0 = time.perf_counter()
        refs, _, _ = ray.get(sender.export.remote())
        ray.get(receiver.load.remote(refs))
        best["driver_sync_s"] = min(best["driver_sync_s"], time.perf_counter() - t0)
        del refs
        t0 = time.perf_counter()
        ray.get(receiver.ping.remote())
        best["ping_s"] = min(best["ping_s"], time.perf_counter() - t0)
    if ray.get(sender.checksum.remote()) != ray.get(receiver.checksum.remote()):
        raise AssertionError("receiver weights differ from sender after sync")
    nbytes = max(1, size_mb // TENSOR_MB) * TENSOR_MB << 20
    memcpy_s = memcpy_seconds(nbytes, repeats)
    for actor in (sender, receiver):
        ray.kill(actor)
    return {"size_mb": nbytes >> 20, **best, "sync_gbps": nbytes / best["sync_s"] / 1e9,
            "memcpy_s": memcpy_s, "memcpy_gbps": nbytes / memcpy_s / 1e9, "ratio": memcpy_s / best["sync_s"]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench weight_sync", description=__doc__)
    parser.add_argument("--sizes-mb", default="100,1000", help="Comma-separated weight sizes in MB.")
    parser.add_argument("--warmup", type=int, default=3, help="Untimed rounds per size first (the processes fault "
                        "in the shared memory they write and map).")
    parser.add_argument("--repeats", type=int, default=5, help="Timed rounds per size (best is reported).")
    parser.add_argument("--bucket-mb", type=int, default=256, help="Bucket size, as learner.bucket_mb.")
    parser.add_argument("--out", default="", help="Also write the results as JSON here.")
    args = parser.parse_args(argv)
    import ray
    from rich.console import Console
    from rich.table import Table

    sizes = [int(s) for s in args.sizes_mb.split(",")]
    rows = []
    for size in sizes:  # each size on a store of 3x its weights, as a run's store is many times its weights
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=size * 3 << 20,
                 _system_config={"preallocate_plasma_memory": True})
        try:
            rows.append(measure(size, args.repeats, args.bucket_mb, args.warmup))
        finally:
            ray.shutdown()
    table = Table(title="learner -> rollout weight sync (CPU, Ray object store)")
    for col in ("size MB", "first sync s", "sync s", "pack s", "put s", "load s", "driver sync s", "ping s",
                "sync GB/s", "memcpy GB/s", "sync / memcpy"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["size_mb"]), f"{r['first_sync_s']:.4f}", f"{r['sync_s']:.4f}", f"{r['pack_s']:.4f}",
                      f"{r['put_s']:.4f}", f"{r['load_s']:.4f}", f"{r['driver_sync_s']:.4f}", f"{r['ping_s']:.4f}", f"{r['sync_gbps']:.2f}",
                      f"{r['memcpy_gbps']:.2f}", f"{r['ratio']:.2f}x")
    Console().print(f"load average {os.getloadavg()[0]:.1f} (the sync and the memcpy share the cores with it)")
    Console().print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0
