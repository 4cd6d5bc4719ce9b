"""The NCCL weight sync without a GPU (`toolbox.engines.nccl_sync`, `toolbox.actors.device_sync`).

- The group plan (ranks, offsets) and the manifest checks, in-process.
- Two real FSDP2 ranks over gloo: both walk the weights (each ``full_tensor()`` is a collective), rank 0 hands the
  whole tensors, in manifest order, to the broadcast producer (a recording stand-in for vLLM's
  ``packed_nccl_broadcast_producer``, which needs CUDA); rank 1 sends nothing.
- The driver side over in-process groups: what each side is told at open, and that afterwards a step's export is
  the send and the engines' load the receive.

The producer and consumer of vLLM itself, with CUDA mocked, run where vllm is installed
(tests/unit/test_engine_contracts.py, ``scripts/engine_contracts.sh``); the real NCCL transfer only on GPUs (tests/gpu).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from toolbox.actors.device_sync import open_nccl_sync
from toolbox.actors.group import LocalGroup
from toolbox.actors.roles import PolicyLearnerGroup, RolloutGroup

from tests.unit.learner_steps import spawn_two_gloo_ranks
from tests.unit.nccl_sync_ranks import fsdp2_send_rank, tiny_model
from toolbox.core.pending import Pending
from toolbox.engines.nccl_sync import NcclSyncInit, NcclWeightSender, checked, plan_group, weight_manifest
from toolbox.rl.weights import TensorSpec


def test_plan_group_puts_learner_rank0_first_and_engines_after() -> None:
    init, offsets = plan_group("10.0.0.1", 29500, [1, 2, 1], buffer_bytes=1 << 20)
    assert (init.world_size, offsets) == (5, [1, 2, 4])  # engine 1 (tp 2) takes ranks 2 and 3
    info = init.worker_info(offsets[2])
    assert info == {"master_address": "10.0.0.1", "master_port": 29500, "world_size": 5, "rank_offset": 4,
                    "packed": True, "packed_buffer_size_bytes": 1 << 20, "packed_num_buffers": 2}
    assert init.trainer_info() == {"master_address": "10.0.0.1", "master_port": 29500, "world_size": 5}
    with pytest.raises(ValueError, match="at least one worker"):
        plan_group("h", 1, [1, 0], 1)


def test_checked_names_the_tensor_that_differs_from_the_manifest() -> None:
    manifest = weight_manifest(torch.nn.Linear(3, 2))
    assert [(s.name, s.dtype, s.shape, s.nbytes) for s in manifest] == [("weight", "float32", (2, 3), 24),
                                                                         ("bias", "float32", (2,), 8)]
    good = [("weight", torch.zeros(2, 3)), ("bias", torch.zeros(2))]
    assert [n for n, _ in checked(iter(good), manifest)] == ["weight", "bias"]
    cases = [([("weight", torch.zeros(2, 3, dtype=torch.bfloat16))], "tensor 0 is 'weight' bfloat16"),
             ([("bias", torch.zeros(2))], "tensor 0 is 'bias'"),
             (good[:1], "sent 1 tensors, 2 were announced"),
             ([*good, ("extra", torch.zeros(1))], "first extra: 'extra'")]
    for pairs, message in cases:
        with pytest.raises(ValueError, match=message):
            list(checked(iter(pairs), manifest))
    sender = NcclWeightSender(torch.nn.Linear(3, 2), 0, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="sees no GPU"):
        sender.open(NcclSyncInit("h", 1, 2, 64))
    sender.init, sender.manifest = NcclSyncInit("h", 1, 2, 64), manifest[:1]
    with pytest.raises(RuntimeError, match="no longer match the manifest"):
        sender.send()


def test_fsdp2_ranks_gather_and_rank0_sends_every_full_tensor(tmp_path: Path) -> None:
    spawn_two_gloo_ranks(fsdp2_send_rank, tmp_path, tmp_path / "out")
    rank0, rank1 = (torch.load(tmp_path / f"out.{r}", weights_only=False) for r in (0, 1))
    reference = tiny_model().state_dict()
    assert [name for name, _ in rank0["sent"]] == list(reference)  # manifest order, FSDP2 names unchanged
    assert all(torch.equal(t, reference[name]) for name, t in rank0["sent"])  # whole, not shards
    assert rank0["bytes"] == sum(t.numel() * 4 for t in reference.values())
    assert rank1["sent"] == [] and rank1["bytes"] == 0  # rank 1 only joined the gathers
    assert rank0["manifest"] == rank1["manifest"]  # the same on every rank, without communication
    assert [s.shape for s in rank0["manifest"]] == [tuple(t.shape) for t in reference.values()]  # full shapes


class FakeLearnerRank:
    """What `LearnerWorker` does for the sync, recorded."""

    def __init__(self, log: list, rank: int) -> None:
        self.log, self.rank = log, rank

    def rendezvous(self) -> tuple[str, int]:
        return "10.0.0.1", 29500

    def weight_manifest(self, dtype: str = "") -> list[TensorSpec]:
        self.log.append(("manifest", self.rank, dtype))
        return [TensorSpec("w", "bfloat16", (2, 2), 8)]

    def open_weight_sync(self, init: NcclSyncInit) -> None:
        self.log.append(("learner open", self.rank, init.world_size))

    def send_weights(self) -> int:
        self.log.append(("send", self.rank))
        return 8 if self.rank == 0 else 0


class FakeRolloutWorker:
    def __init__(self, log: list, rank: int, workers: int) -> None:
        self.log, self.rank, self.workers = log, rank, workers

    def sync_workers(self) -> int:
        return self.workers

    def open_weight_sync(self, info: dict[str, Any], manifest: list[TensorSpec]) -> None:
        self.log.append(("engine open", self.rank, info["rank_offset"], info["world_size"], [s.name for s in manifest]))

    def receive_weights(self) -> float:
        self.log.append(("receive", self.rank))
        return 0.1


def test_driver_opens_the_group_then_export_sends_and_update_receives() -> None:
    log: list = []
    learner = PolicyLearnerGroup(LocalGroup("learner", [FakeLearnerRank(log, r) for r in range(2)]))
    rollout = RolloutGroup(LocalGroup("rollout", [FakeRolloutWorker(log, r, w) for r, w in enumerate((2, 1))]))
    open_nccl_sync(learner, rollout, 1 << 20, dtype="bfloat16")
    assert log.pop(0) == ("manifest", 0, "bfloat16")  # announced in the engines' dtype
    # Engines first (in flight), then every learner rank; nobody waited in between (LocalGroup runs calls at submit).
    assert log == [("engine open", 0, 1, 4, ["w"]), ("engine open", 1, 3, 4, ["w"]),
                   ("learner open", 0, 4), ("learner open", 1, 4)]
    log.clear()
    never_done = Pending([], [], "export_weights", "learner", {}, 1.0, None)  # type: ignore[arg-type]
    sent = learner.export_weights()
    loaded = rollout.update_weights(never_done)  # the receive does not wait for the export (it is the send)
    assert log == [("send", 0), ("send", 1), ("receive", 0), ("receive", 1)]
    assert sent.result() == [8, 0] and loaded.result() == [0.1, 0.1]
    with pytest.raises(TypeError, match="role groups"):
        open_nccl_sync(object(), rollout, 1)


class TimedGroup(LocalGroup):
    """A `LocalGroup` with a role's call deadline that records the deadline each call was submitted with."""

    def __init__(self, role: str, workers: list[Any], timeout_s: float) -> None:
        super().__init__(role, workers)
        self.timeout_s, self.deadlines = timeout_s, {}

    def submit(self, method: Any, calls: Any, ranks: Any = None, timeout_s: float | None = None,
               bulk: bool = False) -> Pending[Any]:
        self.deadlines[method.__name__] = timeout_s
        return super().submit(method, calls, ranks, timeout_s, bulk)


def test_send_deadline_covers_a_generate_it_waits_behind() -> None:
    log: list = []
    learner_group = TimedGroup("learner", [FakeLearnerRank(log, r) for r in range(2)], timeout_s=300.0)
    learner = PolicyLearnerGroup(learner_group)
    rollout = RolloutGroup(TimedGroup("rollout", [FakeRolloutWorker(log, 0, 1)], timeout_s=900.0))
    open_nccl_sync(learner, rollout, 1 << 20)
    learner.export_weights()
    assert learner_group.deadlines["send_weights"] == 900.0 + 300.0  # one rollout call, then the learner's own


def test_send_waits_for_the_device_before_walking_the_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolbox.engines import nccl_sync

    log: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("synchronize", str(device))))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"synchronize": lambda s: None})())

    def walk(model: torch.nn.Module, device: torch.device) -> Any:
        log.append("gather")
        yield from ()

    monkeypatch.setattr(nccl_sync, "full_weights", walk)
    sender = NcclWeightSender(torch.nn.Linear(3, 2), 1, torch.device("cuda", 0))
    sender.init = NcclSyncInit("h", 1, 2, 64)
    sender.send()
    assert log[0] == ("synchronize", "cuda:0") and log[1] == "gather"  # the optimizer step is done before any read


def test_floating_weights_are_announced_and_sent_in_the_engines_dtype() -> None:
    from toolbox.engines.nccl_sync import cast

    model = torch.nn.Embedding(4, 2)
    model.register_buffer("steps", torch.arange(3))
    manifest = weight_manifest(model, "bfloat16")
    assert [(s.name, s.dtype, s.nbytes) for s in manifest] == [("weight", "bfloat16", 16), ("steps", "int64", 24)]
    sent = list(checked(cast(iter(model.state_dict().items()), "bfloat16"), manifest))
    assert [t.dtype for _, t in sent] == [torch.bfloat16, torch.int64]
    assert torch.equal(sent[0][1], model.weight.detach().bfloat16())
