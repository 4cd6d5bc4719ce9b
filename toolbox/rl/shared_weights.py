"""Same-node weight sync through shared memory: the learner writes its weights once, engines map them.

The object-store path (`toolbox.rl.weights`) serialises every sync into a new Ray object: a store allocation,
a copy into pages the sender may never have touched, two actor hops before the engine can look at it. On one node
none of that is needed. Learner rank 0 keeps a small pool of *slots*, anonymous shared memory (``memfd``) of the
weights' size, laid out once from its state dict; a sync is one pass over the weights into a free slot (the only
copy, casting to the engines' dtype on the way) and the bump of a generation counter. Each engine maps every slot
once, read-only, and re-points its parameters at views of the slot that holds the generation it waits for
(`toolbox.rl.weights.load_into`): it copies nothing. Both sides' calls run at the same time, as the NCCL path's do:
the engine sleeps on a pipe of its own, which the learner rings after each publish, until its generation is out.

A slot is written only when no engine can still read it: each engine publishes the generation it holds in the pool's
control block, and a slot whose generation is older than every engine's is free; otherwise the pool grows, up to
`MAX_SLOTS` (the learner then waits for an engine to move on). Slots are memfds, so nothing outlives the processes
that map them (a killed learner leaves no file behind); an engine opens them through ``/proc/<pid>/fd``, which is
why the pool serves only engines on learner rank 0's node, checked with a random nonce rather than assumed.

Not covered: engines on other nodes (they take the object store), LoRA adapter syncs (a few MB, the object store).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import secrets
import select
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from toolbox.rl.weights import TensorSpec, WeightBucket

MAX_SLOTS = 8  # weights-sized slots the pool may hold: engines lagging further make the learner wait
ALIGN = 64  # byte alignment of each tensor in a slot (any dtype's view is aligned; cache lines are not shared)
NONCE = 16
# At most this many threads write a slot, each its own run of about equal bytes: one core's non-temporal stores
# reach 11-12 GB/s on the project's 2-core VM, two cores 20-22 GB/s (`toolbox bench weight_sync`, its "memcpy, N
# threads" column). In a synchronous run the engines wait for the sync, so the cores it borrows are idle; in a run
# sampling ahead (rollout.max_staleness) the copy's threads share the cores with generation for its few ms.
COPY_THREADS = 4
PIECE_BYTES = 1 << 20  # runs are cut at element boundaries no finer than this; a smaller slot is one thread's
# Control block, int64 words after the nonce: slot count, then per slot its memfd number, generation and the
# nanoseconds its last write took, then per reader the generation it holds.
_COUNT, _FDS, _GENS, _COPY_NS = 0, 1, 1 + MAX_SLOTS, 1 + 2 * MAX_SLOTS
_HELD = 1 + 3 * MAX_SLOTS


@dataclass(frozen=True)
class SharedPool:
    """What an engine needs to attach to learner rank 0's slots (small: sent once, at open)."""

    pid: int
    control_fd: int
    nonce: bytes
    manifest: list[TensorSpec]
    offsets: list[int]
    slot_bytes: int
    readers: int
    bells: tuple[int, ...] = ()  # per reader, the read end of the pipe the writer rings after each publish


class SharedWeightsUnavailable(RuntimeError):
    """The pool cannot be opened from this process (another node, another PID namespace, or the learner is gone)."""


def layout(state: Mapping[str, torch.Tensor], dtype: str = "") -> tuple[list[TensorSpec], list[int], int]:
    """Manifest, byte offsets and slot size for ``state``, floating-point tensors in ``dtype`` when given."""
    manifest, offsets, end = [], [], 0
    for name, tensor in state.items():
        kind = dtype if dtype and tensor.is_floating_point() else str(tensor.dtype).removeprefix("torch.")
        nbytes = tensor.numel() * getattr(torch, kind).itemsize
        manifest.append(TensorSpec(name, kind, tuple(tensor.shape), nbytes))
        offsets.append(end)
        end += -(-nbytes // ALIGN) * ALIGN
    return manifest, offsets, max(end, ALIGN)


def write(target: torch.Tensor, tensor: torch.Tensor) -> None:
    """``target[...] = tensor``: libc's ``memcpy`` where the bytes are the same (a contiguous host tensor of the
    slot's dtype), else torch's copy (a cast, or a copy from the GPU, on the way).

    Why memcpy by hand: torch's ``copy_`` runs its own vector loop, whose stores go through the cache (7.5 GB/s on
    one core of the project's 2-core VM at any size); glibc's ``memcpy`` writes around the cache (non-temporal
    stores) above a size threshold, which a run's workers set low (`toolbox.driver.local_ray.NON_TEMPORAL_BYTES`):
    a slot is written once and read by other processes, so its bytes have no business in the writer's cache
    (16 MiB tensors on that VM: 10.4-11.1 GB/s against 6.7-7.9, `toolbox bench weight_sync`)."""
    source = tensor.detach()
    if (source.device.type == "cpu" and source.dtype == target.dtype and source.is_contiguous()
            and target.is_contiguous()):
        ctypes.memmove(target.data_ptr(), source.data_ptr(), source.numel() * source.element_size())
    else:
        target.copy_(source)


def copy_threads() -> int:
    """Threads a slot's write takes: this process's CPUs, at most `COPY_THREADS`."""
    return max(1, min(COPY_THREADS, len(os.sched_getaffinity(0))))


Pair = tuple[torch.Tensor, torch.Tensor]  # (target, source) of one `write`


def runs(pairs: list[Pair], parts: int) -> list[list[Pair]]:
    """``pairs`` cut into at most ``parts`` runs of about equal bytes, in order, for one thread each. A pair is split
    (flat views of both tensors) where it crosses a run's end, unless either side is not contiguous."""
    total = sum(target.numel() * target.element_size() for target, _ in pairs)
    share = max(PIECE_BYTES, -(-total // max(1, parts)))
    out: list[list[Pair]] = [[]]
    room = share
    for target, source in pairs:
        size = target.element_size()
        splittable = target.is_contiguous() and source.is_contiguous()
        flat_target = target.view(-1) if splittable else target
        flat_source = source.reshape(-1) if splittable else source
        start, numel = 0, target.numel()
        while start < numel:
            if room <= 0:
                out.append([])
                room = share
            take = numel - start if not splittable else min(numel - start, max(1, room // size))
            piece = (flat_target, flat_source) if not splittable else (flat_target[start : start + take],
                                                                        flat_source[start : start + take])
            out[-1].append(piece)
            start += take
            room -= take * size
    return out


def _word(fd: int, index: int) -> int:
    return int.from_bytes(os.pread(fd, 8, NONCE + 8 * index), "little", signed=True)


def _words(fd: int, start: int, count: int) -> list[int]:
    raw = os.pread(fd, 8 * count, NONCE + 8 * start)
    return np.frombuffer(raw, dtype=np.int64).tolist()


def _set_word(fd: int, index: int, value: int) -> None:
    # A write through the file, not the mapping: the kernel's page-cache write orders it after the slot's bytes.
    os.pwrite(fd, int(value).to_bytes(8, "little", signed=True), NONCE + 8 * index)


def _write_run(pairs: list[Pair]) -> None:
    for target, source in pairs:
        write(target, source)


class SharedWeightsWriter:
    """Learner rank 0's side: the pool, and `publish`, which copies a state dict into a free slot."""

    def __init__(self, state: Mapping[str, torch.Tensor], readers: int, dtype: str = "", threads: int = 0) -> None:
        if readers < 1:
            raise ValueError(f"a shared weight pool needs at least one reader, got {readers}")
        self.manifest, self.offsets, self.slot_bytes = layout(state, dtype)
        self.threads = threads or copy_threads()
        self.copiers = ThreadPoolExecutor(self.threads - 1, "toolbox-weights") if self.threads > 1 else None
        self.readers, self.generation = readers, 0
        self.control = os.memfd_create("toolbox-weights-control")
        os.ftruncate(self.control, NONCE + 8 * (_HELD + readers))
        self.nonce = secrets.token_bytes(NONCE)
        os.pwrite(self.control, self.nonce, 0)
        os.pwrite(self.control, np.full(MAX_SLOTS, -1, np.int64).tobytes(), NONCE + 8 * _GENS)
        self.slots: list[tuple[int, mmap.mmap, torch.Tensor]] = []
        # One pipe per reader: a publish writes a byte to each, so a waiting reader wakes at once (no polling).
        self.bells = [os.pipe() for _ in range(readers)]
        for _, ring in self.bells:
            os.set_blocking(ring, False)

    @property
    def pool(self) -> SharedPool:
        return SharedPool(os.getpid(), self.control, self.nonce, self.manifest, self.offsets, self.slot_bytes,
                          self.readers, tuple(bell for bell, _ in self.bells))

    @torch.no_grad()
    def publish(self, state: Mapping[str, torch.Tensor], timeout_s: float = 600.0) -> int:
        """Copy ``state`` (the names, shapes of the layout) into a free slot; returns its generation (1, 2, ...)."""
        slot = self._free_slot(timeout_s)
        start = time.perf_counter_ns()
        memory = self.slots[slot][2]
        if len(state) != len(self.manifest):
            raise ValueError(f"shared weight sync: the learner exports {len(state)} tensors, the pool was laid out "
                             f"for {len(self.manifest)}")
        pairs = []
        for (name, tensor), spec, offset in zip(state.items(), self.manifest, self.offsets):
            if name != spec.name or tuple(tensor.shape) != spec.shape:
                raise ValueError(f"shared weight sync: tensor {name!r} {tuple(tensor.shape)} does not match the "
                                 f"pool's {spec.name!r} {spec.shape}")
            pairs.append((memory[offset : offset + spec.nbytes].view(getattr(torch, spec.dtype)).view(spec.shape),
                          tensor.detach()))
        self._write(pairs)
        self.generation += 1
        _set_word(self.control, _COPY_NS + slot, time.perf_counter_ns() - start)
        _set_word(self.control, _GENS + slot, self.generation)  # last: a reader that sees it sees the bytes too
        for _, ring in self.bells:
            with contextlib.suppress(BlockingIOError):  # a full pipe already wakes its reader
                os.write(ring, b"\x01")
        return self.generation

    def _write(self, pairs: list[Pair]) -> None:
        """Every pair written, the runs but the first by the pool's threads (`write` releases the GIL)."""
        first, *rest = runs(pairs, self.threads)  # one run when the writer has one thread
        pending = [self.copiers.submit(_write_run, run) for run in rest] if self.copiers is not None else []
        _write_run(first)
        for future in pending:
            future.result()

    def _free_slot(self, timeout_s: float) -> int:
        """A slot older than every reader's generation (a never-used one counts), else a new one, else wait."""
        deadline = time.monotonic() + timeout_s
        while True:
            gens = _words(self.control, _GENS, len(self.slots))
            floor = min(_words(self.control, _HELD, self.readers))
            free = [i for i, g in enumerate(gens) if g < floor]
            if free:
                return min(free, key=lambda i: gens[i])
            if len(self.slots) < MAX_SLOTS:
                return self._new_slot()
            if time.monotonic() > deadline:
                raise TimeoutError(f"shared weight sync: all {MAX_SLOTS} slots are held by engines still on "
                                   f"generations {sorted(gens)} after {timeout_s:.0f} s")
            time.sleep(1e-3)

    def _new_slot(self) -> int:
        fd = os.memfd_create(f"toolbox-weights-{len(self.slots)}")
        os.ftruncate(fd, self.slot_bytes)
        mapping = mmap.mmap(fd, self.slot_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        memory = torch.frombuffer(mapping, dtype=torch.uint8)
        memory.zero_()  # every page faulted in now, not in the first sync that lands here
        index = len(self.slots)
        self.slots.append((fd, mapping, memory))
        _set_word(self.control, _FDS + index, fd)
        _set_word(self.control, _COUNT, index + 1)
        return index

    def close(self) -> None:
        """Unmap and close the slots (engines that mapped them keep their mappings)."""
        slots, self.slots = [(fd, mapping) for fd, mapping, _ in self.slots], []
        for fd, mapping in slots:
            with contextlib.suppress(BufferError):  # a tensor here still views it: the mapping goes with it
                mapping.close()
            os.close(fd)
        os.close(self.control)
        if self.copiers is not None:
            self.copiers.shutdown()
        for pair in self.bells:
            for fd in pair:
                os.close(fd)


class SharedWeightsReader:
    """An engine's side: maps the slots, waits for a generation, hands its tensors over as read-only buckets."""

    def __init__(self, pool: SharedPool, rank: int) -> None:
        if not 0 <= rank < pool.readers:
            raise ValueError(f"reader rank {rank} outside the pool's {pool.readers} readers")
        self.pool, self.rank, self.generation = pool, rank, 0
        self.copy_s = 0.0  # how long the writer took to write the generation `wait` returned last
        self.control = self._open(pool.control_fd, os.O_RDWR)
        if os.pread(self.control, NONCE, 0) != pool.nonce:
            os.close(self.control)
            raise SharedWeightsUnavailable(f"shared weight sync: /proc/{pool.pid}/fd/{pool.control_fd} is not learner "
                                           "rank 0's pool (another node or PID namespace)")
        self.slots: dict[int, mmap.mmap] = {}
        self.bell = self._open(pool.bells[rank], os.O_RDONLY | os.O_NONBLOCK) if pool.bells else None

    def _open(self, fd: int, flags: int) -> int:
        path = f"/proc/{self.pool.pid}/fd/{fd}"
        try:
            return os.open(path, flags)
        except OSError as err:
            raise SharedWeightsUnavailable(f"shared weight sync: cannot open learner rank 0's pool at {path} "
                                           f"({err.strerror}): not on this node, or the learner is gone") from err

    def wait(self, generation: int, timeout_s: float = 600.0) -> list[WeightBucket]:
        """The tensors of ``generation`` once it is published (views of its slot, no copy). The reader sleeps on its
        pipe until the writer rings it after a publish (looking every second whether the learner still lives)."""
        start = time.monotonic()
        while (slot := self._slot_of(generation)) is None:
            waited = time.monotonic() - start
            if waited > timeout_s:
                raise TimeoutError(f"shared weight sync: reader {self.rank} waited {timeout_s:.0f} s for generation "
                                   f"{generation} from learner rank 0 (pid {self.pool.pid})")
            if waited > 1.0 and not os.path.exists(f"/proc/{self.pool.pid}"):
                raise SharedWeightsUnavailable(f"shared weight sync: learner rank 0 (pid {self.pool.pid}) is gone "
                                               f"before publishing generation {generation}")
            self._sleep(min(1.0, timeout_s - waited))
        self.copy_s = _word(self.control, _COPY_NS + slot) / 1e9
        return [self._bucket(slot)]

    def held(self) -> int:
        """The generation this reader rank last said it holds (0: none), as the control block records it."""
        return _word(self.control, _HELD + self.rank)

    def _sleep(self, seconds: float) -> None:
        """Until the writer rings (or ``seconds`` pass); the rings so far are drained, the caller looks again."""
        if self.bell is None:
            time.sleep(min(seconds, 1e-3))
            return
        select.select([self.bell], [], [], max(0.0, seconds))
        with contextlib.suppress(BlockingIOError):
            os.read(self.bell, 4096)

    def hold(self, generation: int) -> None:
        """Tell the writer this reader now uses ``generation`` (older slots may be written again)."""
        _set_word(self.control, _HELD + self.rank, generation)
        self.generation = generation

    def _slot_of(self, generation: int) -> int | None:
        gens = _words(self.control, _GENS, _word(self.control, _COUNT))
        return gens.index(generation) if generation in gens else None

    def _bucket(self, slot: int) -> WeightBucket:
        if slot not in self.slots:
            fd = self._open(_word(self.control, _FDS + slot), os.O_RDONLY)
            try:
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # page tables built now, not while loading
                self.slots[slot] = mmap.mmap(fd, self.pool.slot_bytes, flags, mmap.PROT_READ)
            finally:
                os.close(fd)
        memory = self.slots[slot]
        arrays = [np.frombuffer(memory, np.uint8, spec.nbytes, offset)
                  for spec, offset in zip(self.pool.manifest, self.pool.offsets)]
        return WeightBucket(list(self.pool.manifest), arrays)
