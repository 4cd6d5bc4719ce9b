"""SGLang over NCCL and the learner's offload while colocated engines generate, without a GPU and without sglang.

- `plan_buckets` (the cut both sides make from the manifest), the sglang wire's init, the sync-path choice for
  SGLang (nccl; the object store with data-parallel replicas) and the config checks of
  ``learner.offload_while_generating``.
- Two real gloo ranks: learner rank 0 sends over the sglang wire (SGLang's two helpers are stand-ins, see
  tests/unit/sglang_sync_ranks.py), rank 1 receives each bucket as the flat byte broadcast SGLang's receiver expects.
- `LearnerWorker` with ``offload_while_generating``: the state leaves after each export and is back before the
  update, a checkpoint and the next export (on a CPU rank nothing moves; the phases are what is checked).

SGLang's real receiver runs in tests/unit/test_engine_contracts.py where sglang is installed; the real moves to and
from the GPU in tests/gpu/test_learner_gpu.py.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from toolbox.actors.learner import LearnerWorker

from tests.unit.learner_steps import spawn_two_gloo_ranks
from tests.unit.sglang_sync_ranks import BUFFER_BYTES, fake_wire_rank, tiny_model
from toolbox.config.schema import ExperimentConfig
from toolbox.engines.nccl_sync import SGLANG_GROUP, NcclSyncInit, NcclWeightSender, plan_buckets, plan_group
from toolbox.engines.placement import choose_sync_path
from toolbox.learner.config import LearnerConfig
from toolbox.learner.host_offload import HostOffload
from toolbox.rl.weights import TensorSpec


def spec(name: str, dtype: str, numel: int) -> TensorSpec:
    return TensorSpec(name, dtype, (numel,), numel * getattr(torch, dtype).itemsize)


def test_plan_buckets_cuts_by_size_and_alignment() -> None:
    manifest = [spec("a", "float32", 4), spec("b", "float32", 4), spec("big", "float32", 20), spec("c", "float32", 1),
                spec("h", "bfloat16", 1), spec("d", "float32", 1), spec("e", "bfloat16", 2)]
    buckets = [[manifest[k].name for k in r] for r in plan_buckets(manifest, 32)]
    # 16 + 16 fill a bucket; 80 bytes travel alone; after the 2-byte bf16 "h" a float32 would start unaligned.
    assert buckets == [["a", "b"], ["big"], ["c", "h"], ["d", "e"]]
    assert plan_buckets([], 32) == []


def test_sglang_wire_init_is_init_weights_update_group_arguments() -> None:
    init, offsets = plan_group("10.0.0.1", 29500, [2, 1], buffer_bytes=1 << 20, wire="sglang")
    assert offsets == [1, 3] and init.world_size == 4
    assert init.worker_info(3) == {"master_address": "10.0.0.1", "master_port": 29500, "world_size": 4,
                                   "rank_offset": 3, "group_name": SGLANG_GROUP, "backend": "nccl",
                                   "buffer_bytes": 1 << 20}


def test_sglang_sync_path_is_nccl_unless_data_parallel() -> None:
    def path(**engine: Any) -> Any:
        cfg = ExperimentConfig(rollout={"gpus_per_worker": 1, "engine": {"name": "sglang", **engine}},
                               learner={"gpus_per_worker": 1})
        return choose_sync_path(cfg)

    assert (path().chosen, path().runs) == ("nccl", "nccl")
    replicas = path(engine_kwargs={"dp_size": 2})
    assert (replicas.chosen, replicas.runs) == ("nccl", "object_store")
    assert "refuses data-parallel replicas (rollout.engine.engine_kwargs.dp_size: 2): falls back to object_store" \
        in replicas.describe()


def test_learner_rank0_sends_buckets_over_the_sglang_wire(tmp_path: Path) -> None:
    spawn_two_gloo_ranks(fake_wire_rank, tmp_path, tmp_path / "out")
    sender, engine = (torch.load(tmp_path / f"out.{r}", weights_only=False) for r in (0, 1))
    assert sender["joined"] == [{"backend": "gloo", "init_method": "tcp://127.0.0.1:1", "world_size": 2, "rank": 0,
                                 "group_name": SGLANG_GROUP}]
    reference = tiny_model().state_dict()
    assert [name for name, _ in engine["received"]] == list(reference)
    assert all(torch.equal(t, reference[name]) for name, t in engine["received"])
    assert sender["bytes"] == sum(t.numel() * 4 for t in reference.values()) > BUFFER_BYTES


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed: open would connect")
def test_sglang_wire_without_sglang_says_where_it_is_needed() -> None:
    sender = NcclWeightSender(tiny_model(), 0, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="sglang must be importable in the learner's environment"):
        sender.open(NcclSyncInit("127.0.0.1", 1, 2, BUFFER_BYTES, wire="sglang", backend="gloo"))
    with pytest.raises(RuntimeError, match="learner rank 0 sees no GPU"):  # the real wire is NCCL: a GPU first
        sender.open(NcclSyncInit("127.0.0.1", 1, 2, BUFFER_BYTES, wire="sglang"))


@pytest.mark.parametrize(("options", "message"), [
    ({"strategy": "ddp"}, "DDP's reducer keeps its gradient buckets"),
    ({"strategy": "fsdp2", "offload": "params"}, "learner.offload: 'params' already keeps the state in host memory"),
])
def test_offload_while_generating_config_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LearnerConfig(offload_while_generating=True, **options)


class OffloadedLearner:
    """A policy learner whose every model-touching call records whether the worker's state was on the device."""

    def __init__(self, log: list) -> None:
        module = torch.nn.Linear(3, 2)
        trained = types.SimpleNamespace(module=module, optimizer=torch.optim.AdamW(module.parameters()))
        self.log, self.worker = log, None
        self.policy = types.SimpleNamespace(
            cfg=LearnerConfig(offload_while_generating=True), trained=trained, companions={}, ref=None,
            export_weights=lambda: self._record("export", []), save=lambda path: self._record("save", path))

    def _record(self, what: str, result: Any) -> Any:
        assert self.worker is not None
        self.log.append((what, self.worker.host.on_device))
        return result

    def update(self, step: int) -> dict[str, float]:
        return self._record("update", {"loss": 0.0})

    def evaluate(self) -> dict[str, float]:
        return {}


def test_learner_offloads_after_export_and_reloads_before_use() -> None:
    log: list = []
    learner = OffloadedLearner(log)
    worker = LearnerWorker(0, 1, lambda: learner, distributed=False, device="cpu")
    learner.worker = worker
    worker.setup("127.0.0.1", 0, 10.0)
    assert isinstance(worker.host, HostOffload) and worker.host.modules[0][0] is learner.policy.trained.module
    worker.update_offline(1)
    worker.export_weights()
    assert worker.host.on_device is False  # from the export until the engines have generated
    worker.update_offline(2)
    worker.export_weights()
    worker.save("somewhere")
    assert log == [("update", True), ("export", True), ("update", True), ("export", True), ("save", True)]
    before = {k: v.clone() for k, v in learner.policy.trained.module.state_dict().items()}
    worker.host.offload()
    worker.host.reload()  # on a CPU rank nothing moves and nothing changes
    assert all(torch.equal(v, before[k]) for k, v in learner.policy.trained.module.state_dict().items())


def test_learner_without_offload_has_no_offloader() -> None:
    learner = OffloadedLearner([])
    learner.policy.cfg = LearnerConfig()
    worker = LearnerWorker(0, 1, lambda: learner, distributed=False, device="cpu")
    worker.setup("127.0.0.1", 0, 10.0)
    assert worker.host is None
