"""The shared-memory weight pool: one copy on the learner, none on the engine, and no slot written while read.

A second process (multiprocessing, spawn) plays the engine where the point is that it is another process: it opens
the pool through ``/proc/<pid>/fd`` as a rollout worker does.
"""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest
import torch

from toolbox.rl.shared_weights import (
    MAX_SLOTS,
    PIECE_BYTES,
    SharedPool,
    SharedWeightsReader,
    SharedWeightsUnavailable,
    SharedWeightsWriter,
    layout,
    runs,
    write,
)
from toolbox.rl.weights import load_into, unpack_all


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_layout_aligns_each_tensor_and_casts_floating_point_ones() -> None:
    state = {"w": torch.zeros(3, 5), "steps": torch.zeros(2, dtype=torch.long)}
    manifest, offsets, size = layout(state, "bfloat16")
    assert [(s.name, s.dtype, s.shape, s.nbytes) for s in manifest] == [("w", "bfloat16", (3, 5), 30),
                                                                      ("steps", "int64", (2,), 16)]
    assert offsets == [0, 64] and size == 128


@pytest.mark.parametrize("make", [lambda t: t, lambda t: t.t(), lambda t: t.double()],
                         ids=["same bytes", "a strided view", "a cast"])
def test_write_copies_every_layout_of_the_source(make: object) -> None:
    """memcpy for a contiguous tensor of the target's dtype; a strided view or another dtype takes torch's copy."""
    source = make(torch.randn(64, 48))  # type: ignore[operator]
    target = torch.empty(source.shape, dtype=torch.float32)
    write(target, source)
    assert torch.equal(target, source.float())


def test_runs_cut_the_copies_into_equal_shares_in_order() -> None:
    """Three threads' runs over 5 MiB of float32: each about a third, splitting tensors at element boundaries; a
    strided source stays whole; together the runs cover every element once, in the pairs' order."""
    sources = [torch.randn(PIECE_BYTES // 4 * 3), torch.randn(64, 48).t(), torch.randn(PIECE_BYTES // 4 * 2)]
    targets = [torch.empty(s.shape) for s in sources]
    cut = runs(list(zip(targets, sources)), 3)
    shares = [sum(t.numel() * 4 for t, _ in run) for run in cut]
    total = sum(t.numel() * 4 for t in targets)
    assert len(cut) == 3 and sum(shares) == total and max(shares) - min(shares) <= 64 * 48 * 4
    assert all(len(run) >= 1 for run in cut) and [t.shape for t, _ in cut[1] if t.dim() == 2] == [(48, 64)]
    for run in cut:
        for target, source in run:
            write(target, source)
    assert all(torch.equal(t, s) for t, s in zip(targets, sources))
    assert len(runs(list(zip(targets, sources)), 1)) == 1  # one thread: one run
    assert len(runs([(torch.empty(8), torch.randn(8))], 4)) == 1  # under PIECE_BYTES: one run


@pytest.mark.parametrize("threads", [1, 3])
def test_a_threaded_publish_writes_what_a_single_one_does(threads: int) -> None:
    state = {f"p{i}": torch.randn(PIECE_BYTES // 4 + 7 * i) for i in range(4)} | {"w": torch.randn(9, 5).t()}
    writer = SharedWeightsWriter(state, readers=1, dtype="bfloat16", threads=threads)
    reader = SharedWeightsReader(writer.pool, 0)
    writer.publish(state)
    got = unpack_all(reader.wait(1, timeout_s=5))
    assert writer.threads == threads and list(got) == list(state)
    for name, tensor in state.items():
        assert torch.equal(got[name], tensor.to(torch.bfloat16)), name
    writer.close()


def test_engine_points_at_the_slot_without_copying() -> None:
    learner, engine = model(0), model(1)
    writer = SharedWeightsWriter(learner.state_dict(), readers=1)
    reader = SharedWeightsReader(writer.pool, 0)
    assert writer.publish(learner.state_dict()) == 1
    load_into(engine, reader.wait(1, timeout_s=5))
    reader.hold(1)
    mapped = np.frombuffer(reader.slots[0], np.uint8)  # the engine's own read-only mapping of the slot
    for name, tensor in engine.state_dict().items():
        assert torch.equal(tensor, learner.state_dict()[name])
        start = tensor.data_ptr() - mapped.ctypes.data
        assert 0 <= start < mapped.size, f"{name} was copied, not mapped"
    x = torch.randn(4, 8)
    assert torch.equal(engine(x), learner(x))


def test_slots_are_reused_only_once_every_reader_moved_on() -> None:
    learner = model(0)
    writer = SharedWeightsWriter(learner.state_dict(), readers=2)
    first, second = SharedWeightsReader(writer.pool, 0), SharedWeightsReader(writer.pool, 1)
    for generation in (1, 2):
        assert writer.publish(learner.state_dict()) == generation
    assert len(writer.slots) == 2  # nobody loaded generation 1 yet: it is pending, not free
    first.hold(2)
    second.hold(1)
    writer.publish(learner.state_dict())
    assert len(writer.slots) == 3  # reader 1 still reads generation 1's slot
    second.hold(3)
    writer.publish(learner.state_dict())  # generation 4 lands in generation 1's slot, which nobody holds
    assert len(writer.slots) == 3
    assert first.wait(4, timeout_s=5)[0].arrays[0].ctypes.data == np.frombuffer(first.slots[0], np.uint8).ctypes.data
    with pytest.raises(TimeoutError, match="reader 0 waited 0 s for generation 1"):
        first.wait(1, timeout_s=0.0)


def test_a_full_pool_waits_then_says_which_generations_hold_it() -> None:
    writer = SharedWeightsWriter({"w": torch.zeros(4)}, readers=1)
    for _ in range(MAX_SLOTS):
        writer.publish({"w": torch.zeros(4)})
    with pytest.raises(TimeoutError, match=f"all {MAX_SLOTS} slots are held by engines still on generations"):
        writer.publish({"w": torch.zeros(4)}, timeout_s=0.05)


def test_a_state_dict_unlike_the_layout_is_refused_by_name() -> None:
    writer = SharedWeightsWriter({"w": torch.zeros(4)}, readers=1)
    with pytest.raises(ValueError, match=r"tensor 'w' \(5,\) does not match the pool's 'w' \(4,\)"):
        writer.publish({"w": torch.zeros(5)})


def test_a_pool_of_another_process_is_refused() -> None:
    writer = SharedWeightsWriter({"w": torch.zeros(4)}, readers=1)
    pool = writer.pool
    forged = SharedPool(pool.pid, pool.control_fd, b"x" * 16, pool.manifest, pool.offsets, pool.slot_bytes, 1)
    with pytest.raises(SharedWeightsUnavailable, match="is not learner rank 0's pool"):
        SharedWeightsReader(forged, 0)
    gone = SharedPool(2**22 + 7, 3, pool.nonce, pool.manifest, pool.offsets, pool.slot_bytes, 1)
    with pytest.raises(SharedWeightsUnavailable, match="not on this node, or the learner is gone"):
        SharedWeightsReader(gone, 0)


def _engine(pool: SharedPool, out: mp.Queue) -> None:
    engine = model(1)
    reader = SharedWeightsReader(pool, 0)
    for generation in (1, 2):
        load_into(engine, reader.wait(generation, timeout_s=30))
        reader.hold(generation)
        out.put({k: v.numpy().tobytes() for k, v in engine.state_dict().items()})  # bytes: no tensor sharing


def test_another_process_loads_each_generation_in_its_turn() -> None:
    learner = model(0)
    writer = SharedWeightsWriter(learner.state_dict(), readers=1)
    out: mp.Queue = mp.get_context("spawn").Queue()
    engine = mp.get_context("spawn").Process(target=_engine, args=(writer.pool, out))
    engine.start()
    try:
        writer.publish(learner.state_dict())
        assert out.get(timeout=60) == {k: v.numpy().tobytes() for k, v in learner.state_dict().items()}
        with torch.no_grad():
            for p in learner.parameters():
                p.add_(1.0)
        writer.publish(learner.state_dict())
        assert out.get(timeout=60) == {k: v.numpy().tobytes() for k, v in learner.state_dict().items()}
    finally:
        engine.join(timeout=30)
    assert engine.exitcode == 0 and os.getpid() == writer.pool.pid
