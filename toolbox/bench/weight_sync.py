"""Learner -> rollout weight sync throughput, beside a plain memcpy of the same bytes.

``python -m toolbox.bench weight_sync [--sizes-mb 100,1000] [--warmup 3] [--repeats 5]``

Two paths, alternating within each round, each as a run takes it:

- ``shared`` (learner rank 0 and the engines on one node, `toolbox.rl.shared_weights`): the sender writes its
  parameters into a free slot of its shared-memory pool (the one copy) and the receiver, whose call is in flight at
  the same time (as the role groups submit them), waits for that generation and re-points its parameters at its
  own read-only mapping of the slot (`load_into`: no copy). ``engine copies`` counts the receiver's parameters that
  do not view the slot afterwards (0: none was copied).
- ``object store`` (engines on other nodes): the sender packs its parameters into buckets and puts them in the
  object store (``export_weights``); the export's ref goes straight into the receiver's one call (``load_into``).

The clock runs from the first call to the last return, seen from the driver. ``ping`` is an empty actor call's
round trip, the fixed latency of one call. The memcpy baseline copies the same bytes between two warm numpy
buffers, single-threaded, in a worker process of its own, once in every round after the two syncs (best of the
rounds, as theirs), and again split over as many threads as the sender's slot write takes
(`toolbox.rl.shared_weights.copy_threads`): the machine's copy limit for that many cores. Sender and receiver run
one torch thread each. Ray starts as a run's local instance does
(`toolbox.driver.local_ray.start_local`), so all three processes have a run's worker environment, and with it the
same ``memcpy`` (`toolbox.driver.local_ray.NON_TEMPORAL_BYTES`).

Both paths fault in shared memory the first time a process touches it: the pool when a slot is made (the sender
zeroes it), the object store per object (pre-faulted store, but each process maps new objects' pages). ``first
sync s`` is the shared path's first round; the other columns are the best of ``--repeats`` rounds after ``--warmup``
untimed ones, the steady state of a run that syncs every step. Each size runs on a Ray instance of its own whose
store holds 3x its weights: on a store many times larger new objects keep landing in pages the sender has not
touched yet (96 MB on a 3 GB store: 0.18x memcpy after 8 rounds, 0.54-0.56x on a 300 MB one).
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
    """Holds weights like learner rank 0: exports them as bucket refs, or publishes them into its shared pool."""

    def __init__(self, total_mb: int, bucket_mb: int, readers: int = 1) -> None:
        from toolbox.rl.shared_weights import SharedWeightsWriter

        torch.set_num_threads(1)
        self.module, self.bucket_mb = make_module(total_mb, seed=1), bucket_mb
        self.writer = SharedWeightsWriter(self.module.state_dict(), readers)

    def pool(self) -> Any:
        return self.writer.pool

    def threads(self) -> int:
        return self.writer.threads

    def update(self, seconds: float) -> float:
        """The learner's update the sync is queued behind (a sleep); returns when it ended (``time.monotonic``,
        one clock for every process of the machine)."""
        time.sleep(seconds)
        return time.monotonic()

    def export(self) -> tuple[list[Any], float, float]:
        import ray

        from toolbox.rl.weights import pack_state_dict

        t0 = time.perf_counter()
        buckets = pack_state_dict(self.module.state_dict(), self.bucket_mb << 20)
        t1 = time.perf_counter()
        refs = [ray.put(b) for b in buckets]
        return refs, t1 - t0, time.perf_counter() - t1

    def publish(self) -> tuple[int, float]:
        """The shared path's send: (generation, seconds of the copy into the slot)."""
        t0 = time.perf_counter()
        generation = self.writer.publish(self.module.state_dict())
        return generation, time.perf_counter() - t0

    def checksum(self) -> float:
        return float(sum(p.double().sum() for p in self.module.parameters()))


class Receiver:
    """Holds weights like a rollout engine and loads bucket refs, or the sender's pool's next generation."""

    def __init__(self, total_mb: int) -> None:
        torch.set_num_threads(1)
        self.module = make_module(total_mb, seed=2)
        self.reader: Any = None

    def attach(self, pool: Any) -> None:
        from toolbox.rl.shared_weights import SharedWeightsReader

        self.reader = SharedWeightsReader(pool, 0)

    def load(self, exported: list[Any] | tuple[list[Any], float, float]) -> tuple[float, float]:
        """Load the bucket refs (``exported``: `Sender.export`'s refs, or its whole result when chained)."""
        import ray

        from toolbox.rl.weights import load_into

        refs = exported[0] if isinstance(exported, tuple) else exported
        t0 = time.perf_counter()
        load_into(self.module, ray.get(refs))
        return time.perf_counter() - t0, time.monotonic()

    def receive(self) -> tuple[float, float]:
        """The shared path's load of the next generation: (seconds from the call's start, when it ended)."""
        from toolbox.rl.weights import load_into

        t0 = time.perf_counter()
        generation = self.reader.generation + 1
        load_into(self.module, self.reader.wait(generation, timeout_s=60))
        self.reader.hold(generation)
        return time.perf_counter() - t0, time.monotonic()

    def copied(self) -> int:
        """Parameters whose memory is not in one of the reader's slot mappings."""
        spans = [(a.ctypes.data, a.ctypes.data + a.size)
                 for a in (np.frombuffer(m, np.uint8) for m in self.reader.slots.values())]
        return sum(not any(lo <= p.data_ptr() < hi for lo, hi in spans) for p in self.module.parameters())

    def ping(self) -> None:
        return None

    def checksum(self) -> float:
        return float(sum(p.double().sum() for p in self.module.parameters()))


class Memcpy:
    """The baseline: the same bytes copied between two warm numpy buffers, by one thread or by ``threads`` threads
    each copying its own contiguous share (numpy's copy releases the GIL)."""

    def __init__(self, nbytes: int, threads: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        self.dst = np.empty_like(self.src)
        np.copyto(self.dst, self.src)  # warm both buffers
        cuts = np.linspace(0, nbytes, threads + 1).astype(int)
        self.shares = [(self.dst[a:b], self.src[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
        self.pool = ThreadPoolExecutor(threads)

    def seconds(self, threaded: bool = False) -> float:
        t0 = time.perf_counter()
        if threaded:
            list(self.pool.map(lambda share: np.copyto(*share), self.shares))
        else:
            np.copyto(self.dst, self.src)
        return time.perf_counter() - t0


UPDATE_S = 0.02  # the stand-in learner update each queued sync waits behind


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def shared_round(sender: Any, receiver: Any, queued: bool) -> tuple[float, float, float]:
    """One shared-memory sync: (seconds, the sender's copy seconds, the receiver's load seconds). ``queued``: both
    calls wait behind a learner update, as in a run, and the seconds run from the update's end to the load's end
    (the sync's share of the step); else from the driver's submit to its last result (two calls' latency)."""
    import ray

    update = [sender.update.remote(UPDATE_S)] if queued else []
    (*res, (_, copy_s), (load_s, end)), seconds = timed(lambda: ray.get(
        [*update, sender.publish.remote(), receiver.receive.remote()]))
    return (end - res[0] if queued else seconds), copy_s, load_s


def store_round(sender: Any, receiver: Any, queued: bool) -> tuple[float, Any, float]:
    """One object-store sync, the export's ref chained into the receiver's call: (seconds, the export's ref, the
    receiver's load seconds), timed as `shared_round` does."""
    import ray

    update = [sender.update.remote(UPDATE_S)] if queued else []
    exported = sender.export.remote()
    (*res, (load_s, end)), seconds = timed(lambda: ray.get([*update, receiver.load.remote(exported)]))
    return (end - res[0] if queued else seconds), exported, load_s


def measure(size_mb: int, repeats: int, bucket_mb: int, warmup: int = 3) -> dict[str, float]:
    """Best of ``repeats`` rounds (after ``warmup``) of each path queued and from the driver, the memcpy between."""
    import ray

    sender = ray.remote(Sender).options(num_cpus=0.5).remote(size_mb, bucket_mb)
    receiver = ray.remote(Receiver).options(num_cpus=0.5).remote(size_mb)
    ray.get(receiver.attach.remote(sender.pool.remote()))
    nbytes = max(1, size_mb // TENSOR_MB) * TENSOR_MB << 20
    (threads,) = ray.get([sender.threads.remote()])
    memcpy = ray.remote(Memcpy).options(num_cpus=0).remote(nbytes, threads)
    best: dict[str, float] = dict.fromkeys(("sync_s", "trip_s", "store_sync_s", "store_trip_s", "ping_s",
                                            "memcpy_s", "memcpy_threads_s"), float("inf"))
    for round_ in range(warmup + repeats):
        sync_s, copy_s, load_s = shared_round(sender, receiver, queued=True)
        trip_s = shared_round(sender, receiver, queued=False)[0]
        store_sync_s, exported, _ = store_round(sender, receiver, queued=True)
        store_trip_s = store_round(sender, receiver, queued=False)[0]
        if round_ == 0:
            best["first_sync_s"] = sync_s
        if round_ < warmup:
            continue
        if sync_s < best["sync_s"]:
            best.update(sync_s=sync_s, copy_s=copy_s, load_s=load_s)
        if store_sync_s < best["store_sync_s"]:
            best.update(store_sync_s=store_sync_s, put_s=ray.get(exported)[2])
        best.update(trip_s=min(best["trip_s"], trip_s), store_trip_s=min(best["store_trip_s"], store_trip_s),
                    ping_s=min(best["ping_s"], timed(lambda: ray.get(receiver.ping.remote()))[1]),
                    memcpy_s=min(best["memcpy_s"], float(ray.get(memcpy.seconds.remote()))),  # every round, between syncs
                    memcpy_threads_s=min(best["memcpy_threads_s"], float(ray.get(memcpy.seconds.remote(True)))))
    # The last load was the object store's: one more shared round, then both sides must hold the same weights and
    # the receiver's parameters must all view its slot mapping (the shared path copies nothing on the engine).
    shared_round(sender, receiver, queued=False)
    if ray.get(sender.checksum.remote()) != ray.get(receiver.checksum.remote()):
        raise AssertionError("receiver weights differ from sender after sync")
    best["engine_copies"] = float(ray.get(receiver.copied.remote()))
    for actor in (sender, receiver, memcpy):
        ray.kill(actor)
    memcpy_s = best["memcpy_s"]
    return {"size_mb": nbytes >> 20, "threads": threads, **best, "sync_gbps": nbytes / best["sync_s"] / 1e9,
            "memcpy_gbps": nbytes / memcpy_s / 1e9, "ratio": memcpy_s / best["sync_s"],
            "memcpy_threads_gbps": nbytes / best["memcpy_threads_s"] / 1e9,
            "threads_ratio": best["memcpy_threads_s"] / best["sync_s"],
            "trip_ratio": memcpy_s / best["trip_s"], "store_ratio": memcpy_s / best["store_sync_s"]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench weight_sync", description=__doc__)
    parser.add_argument("--sizes-mb", default="100,1000", help="Comma-separated weight sizes in MB.")
    parser.add_argument("--warmup", type=int, default=3, help="Untimed rounds per size first (the processes fault "
                        "in the shared memory they write and map).")
    parser.add_argument("--repeats", type=int, default=5, help="Timed rounds per size (best is reported).")
    parser.add_argument("--bucket-mb", type=int, default=256, help="Bucket size, as learner.bucket_mb.")
    parser.add_argument("--out", default="", help="Also write the results as JSON here.")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    from toolbox.driver.local_ray import shutdown, start_local

    sizes = [int(s) for s in args.sizes_mb.split(",")]
    rows = []
    for size in sizes:  # each size on a store of 3x its weights, as a run's store is many times its weights
        start_local({"num_cpus": 2, "include_dashboard": False, "log_to_driver": False,
                     "object_store_memory": size * 3 << 20, "_system_config": {"preallocate_plasma_memory": True}})
        try:
            rows.append(measure(size, args.repeats, args.bucket_mb, args.warmup))
        finally:
            shutdown()
    table = Table(title="learner -> rollout weight sync on one node (CPU): shared memory, and the object store")
    cols = {"first sync s": "first_sync_s", "sync s": "sync_s", "copy s": "copy_s", "from driver s": "trip_s",
            "store sync s": "store_sync_s", "put s": "put_s", "store from driver s": "store_trip_s", "ping s": "ping_s"}
    for col in ("size MB", "copy threads", *cols, "engine copies", "sync GB/s", "memcpy GB/s",
                "memcpy, copy threads GB/s", "sync / memcpy", "sync / memcpy, copy threads", "from driver / memcpy",
                "store / memcpy"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["size_mb"]), str(r["threads"]), *(f"{r[k]:.4f}" for k in cols.values()),
                      str(int(r["engine_copies"])), f"{r['sync_gbps']:.2f}", f"{r['memcpy_gbps']:.2f}",
                      f"{r['memcpy_threads_gbps']:.2f}",
                      *(f"{r[k]:.2f}x" for k in ("ratio", "threads_ratio", "trip_ratio", "store_ratio")))
    Console().print(f"load average {os.getloadavg()[0]:.1f} (the sync and the memcpy share the cores with it)")
    Console().print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0
