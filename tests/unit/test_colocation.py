"""``rollout.placement: colocate`` without Ray: the config checks, the shared bundle, the weight-sync path choice, and
the order in which a colocated step drives a (recording) engine and the learner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from toolbox.actors.group import LocalGroup
from toolbox.actors.roles import PolicyLearnerGroup, RewardGroup, RolloutGroup
from toolbox.actors.rollout import RolloutWorker

from tests.unit.test_trainer import ALGO, CharTokenizer, FakeLearner, FakeReward
from toolbox.config.schema import ExperimentConfig
from toolbox.config.trainer import TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.core.events import EventBus
from toolbox.data.prompts import PromptSource
from toolbox.data.tasks import TASKS
from toolbox.engines.base import SamplingConfig
from toolbox.engines.placement import choose_sync_path, colocated_bundle
from toolbox.rl.batch import PromptRequest
from toolbox.trainers.online import OnlineTrainer


def config(**sections: Any) -> ExperimentConfig:
    return ExperimentConfig(**sections)


COLOCATE = {"placement": "colocate", "num_workers": 2}


@pytest.mark.parametrize(("sections", "message"), [
    ({"rollout": {**COLOCATE, "num_workers": 3}}, "rollout.num_workers (3) must equal learner.num_workers (2)"),
    ({"rollout": {**COLOCATE, "engine": {"name": "vllm"}}}, "set rollout.engine.enable_sleep_mode: true"),
    ({"rollout": {**COLOCATE, "engine": {"name": "sglang"}}}, "set rollout.engine.enable_memory_saver: true"),
    ({"rollout": COLOCATE, "algorithm": {"name": "sft"}}, "algorithm 'sft' has the roles"),
    ({"rollout": COLOCATE, "ray": {"placement": {"rollout": {"strategy": "SPREAD"}, "learner": {}}}},
     "different strategies"),
])
def test_colocate_config_errors_name_the_field(sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(**sections)


def test_colocated_bundle_holds_both_actors() -> None:
    cfg = config(rollout={**COLOCATE, "cpus_per_worker": 0.25, "gpus_per_worker": 0.5},
                 learner={"cpus_per_worker": 0.5, "gpus_per_worker": 0.5},
                 ray={"placement": {"learner": {"resources": {"gpu_node": 1}, "strategy": "STRICT_PACK"}}})
    assert colocated_bundle(cfg) == ({"CPU": 0.75, "GPU": 1.0, "gpu_node": 1.0}, "STRICT_PACK")
    assert colocated_bundle(config(rollout=COLOCATE)) == ({"CPU": 0.75}, "PACK")  # no GPU key on CPU


def _path(rollout: dict[str, Any], learner: dict[str, Any] | None = None, learner_nodes: list[str | None] | None = None,
          rollout_nodes: list[str | None] | None = None) -> tuple[str, str]:
    cfg = config(rollout=rollout, learner=learner or {})
    chosen = choose_sync_path(cfg, learner_nodes, rollout_nodes)
    return chosen.chosen, chosen.runs


VLLM = {"name": "vllm", "enable_sleep_mode": True}
GPU_HALF = {"gpus_per_worker": 0.5}


def test_sync_path_choice() -> None:
    # CPU learner, or an engine that loads CPU buckets itself (hf), or an engine without a GPU: the object store.
    assert _path({"engine": VLLM, "gpus_per_worker": 1}) == ("object_store", "object_store")
    assert _path({**COLOCATE, **GPU_HALF}, GPU_HALF) == ("object_store", "object_store")  # hf engine
    assert _path({"engine": VLLM}, {"gpus_per_worker": 1}) == ("object_store", "object_store")
    assert _path({"engine": VLLM, "gpus_per_worker": 1}, {"gpus_per_worker": 1, "device": "cpu"}) == \
        ("object_store", "object_store")
    # Colocated on one GPU (0.5 + 0.5): CUDA IPC, which the vLLM / SGLang adapters implement.
    assert _path({**COLOCATE, **GPU_HALF, "engine": VLLM}, GPU_HALF) == ("cuda_ipc", "cuda_ipc")
    sglang = {"name": "sglang", "enable_memory_saver": True}
    assert _path({**COLOCATE, **GPU_HALF, "engine": sglang}, GPU_HALF) == ("cuda_ipc", "cuda_ipc")
    # Both on GPUs of their own (colocated 1 + 1, or split, on any nodes): NCCL from learner rank 0 (vLLM).
    assert _path({**COLOCATE, "gpus_per_worker": 1, "engine": VLLM}, {"gpus_per_worker": 1}) == ("nccl", "nccl")
    split = {"engine": VLLM, "gpus_per_worker": 1}
    assert _path(split, {"gpus_per_worker": 1}) == ("nccl", "nccl")
    assert _path(split, {"gpus_per_worker": 1}, learner_nodes=["a", "a"], rollout_nodes=["a"]) == ("nccl", "nccl")
    text = choose_sync_path(config(rollout=split, learner={"gpus_per_worker": 1}), ["a"], ["b"]).describe()
    assert text.startswith("weight sync: nccl (") and "other nodes" in text
    # ... except LoRA (CPU merge / adapter) and in-process runs; SGLang takes NCCL too (its fallback:
    # tests/unit/test_sglang_sync.py).
    lora = {"gpus_per_worker": 1, "lora": {"r": 4}}
    assert _path(split, lora) == ("object_store", "object_store")
    assert _path({**split, "engine": {"name": "sglang"}}, {"gpus_per_worker": 1}) == ("nccl", "nccl")


def test_hf_engines_on_learner_rank_0s_node_take_shared_memory() -> None:
    assert _path({}, None, ["a", "b"], ["a", "a"]) == ("shared_memory", "shared_memory")
    # Any engine on another node, nodes not known yet (before start, in-process runs), LoRA: the object store.
    assert _path({}, None, ["a", "b"], ["a", "b"]) == ("object_store", "object_store")
    assert _path({}, None, ["b", "a"], ["a"]) == ("object_store", "object_store")
    assert _path({}) == ("object_store", "object_store")
    assert _path({}, {"lora": {"r": 4}}, ["a"], ["a"]) == ("object_store", "object_store")


class FakeBatch(dict):
    """Stands in for a RolloutBatch (``rows``, as the fake reward reads it); takes the ``seconds`` the worker sets."""


class RecordingEngine:
    """An engine that writes what it is asked to do into a log shared with the learner."""

    def __init__(self, log: list[str], rank: int) -> None:
        self.log, self.rank = log, rank

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> FakeBatch:
        self.log.append(f"generate{self.rank}")
        return FakeBatch(rows=len(requests))

    def sleep(self) -> None:
        self.log.append(f"sleep{self.rank}")

    def wake(self) -> None:
        self.log.append(f"wake{self.rank}")

    def update_weights(self, buckets: list[Any]) -> int:
        self.log.append(f"update_weights{self.rank}")
        return 0


class RecordingLearner(FakeLearner):
    def __init__(self, log: list[str]) -> None:
        super().__init__(0)
        self.log = log

    def update_planned(self, plan: dict[str, Any], batches: list[dict[str, int]]) -> dict[str, float]:
        self.log.append("learner_update")
        return super().update_planned(plan, batches)


def _trainer(tmp_path: Path, log: list[str], colocate: bool) -> OnlineTrainer:
    engines = [RecordingEngine(log, r) for r in range(2)]
    rollout = [RolloutWorker(r, build=engines.__getitem__) for r in range(2)]
    prompts = PromptSource(TASKS.build({"name": "digit_add"}), CharTokenizer(), seed=0)
    return OnlineTrainer(TrainerConfig(total_steps=2, save_every=0, log_samples_every=0), EventBus(), ALGO,
                         SamplingConfig(), prompts, RolloutGroup(LocalGroup("rollout", rollout)),
                         RewardGroup(LocalGroup("reward", [FakeReward()])),
                         PolicyLearnerGroup(LocalGroup("learner", [RecordingLearner(log)])), tmp_path,
                         colocate=colocate)


def test_colocated_step_sleeps_engines_while_the_learner_trains(tmp_path: Path) -> None:
    log: list[str] = []
    trainer = _trainer(tmp_path, log, colocate=True)
    trainer.prepare()
    assert log == ["update_weights0", "update_weights1"]  # awake at start: no wake before the first sync
    log.clear()
    trainer.run_step(0)  # step 1's calls go out before step 0's wait: a second step starts from awake engines
    step = ["generate0", "sleep0", "generate1", "sleep1", "learner_update",
            "wake0", "update_weights0", "wake1", "update_weights1"]
    assert log == step + step
    trainer.run_step(1)
    assert log == step + step


def test_split_step_never_sleeps(tmp_path: Path) -> None:
    log: list[str] = []
    trainer = _trainer(tmp_path, log, colocate=False)
    trainer.run_step(0)
    assert not any(e.startswith(("sleep", "wake")) for e in log)


def test_a_retried_step_finds_a_sleeping_engine_awake() -> None:
    """A step that failed after the engines went to sleep (a dead learner rank) runs again: generate wakes first."""
    log: list[str] = []
    worker = RolloutWorker(0, build=lambda r: RecordingEngine(log, r))
    worker.generate([PromptRequest(ids=[1], group=0)], SamplingConfig(), sleep_after=True)
    worker.generate([PromptRequest(ids=[1], group=0)], SamplingConfig())
    assert log == ["generate0", "sleep0", "wake0", "generate0"]


def test_dry_run_shows_the_shared_bundles_and_the_sync_path() -> None:
    from rich.console import Console

    from toolbox.config import load_config
    from toolbox.driver import dry_run

    cfg = load_config(["experiment=grpo_tiny_fsdp2", "rollout.placement=colocate", "rollout.num_workers=2",
                       "learner.num_workers=2"])
    rows = {r[0]: r[4] for r in dry_run.actor_rows(cfg)}
    assert rows["rollout"] == "one, with learner rank i in bundle i: 2 x {CPU: 0.75}, PACK"
    assert rows["learner"].startswith("one, with rollout worker i in bundle i")
    console = Console(record=True, width=200)
    assert dry_run.print_dry_run(cfg, console) == 0
    assert "weight sync: object_store (the hf engine loads CPU buckets itself)" in console.export_text()


def test_sleep_and_wake_are_optional_and_free_nothing_on_cpu(tiny_model_dir: Path) -> None:
    from toolbox.engines.base import sleep_engine, wake_engine
    from toolbox.engines.hf import HFEngine

    sleep_engine(object())  # an engine without sleep/wake (an HTTP server's client): nothing to do
    wake_engine(object())
    engine = HFEngine(str(tiny_model_dir))
    before = {k: v.clone() for k, v in engine.state_dict().items()}
    engine.sleep()
    engine.wake()
    after = engine.state_dict()
    assert all(t.device.type == "cpu" and t.equal(before[k]) for k, t in after.items())
    batch = engine.generate([PromptRequest(ids=[1, 2], group=0)], SamplingConfig(max_new_tokens=2))
    assert batch.response_ids_BR.shape[0] == 1


def test_split_refuses_gpu_fractions_that_could_share_one_nccl_device() -> None:
    with pytest.raises(ConfigError, match=r"learner.gpus_per_worker: 0.5 with 2 ranks: Ray may put two ranks on one"):
        config(learner={"gpus_per_worker": 0.5})
    with pytest.raises(ConfigError, match=r"rollout.gpus_per_worker: 0.5 with the NCCL weight sync"):
        config(rollout={"engine": VLLM, "gpus_per_worker": 0.5}, learner={"gpus_per_worker": 1})
    config(learner={"gpus_per_worker": 0.5, "num_workers": 1, "strategy": "single"})  # one rank: no communicator
    config(rollout={"gpus_per_worker": 0.5}, learner={"gpus_per_worker": 1})  # hf engine: the object store
    config(rollout={**COLOCATE, **GPU_HALF, "engine": VLLM}, learner=GPU_HALF)  # colocated: a bundle per GPU


class StartOrderBuilder:
    """What `ExperimentBuilder.start` asks of the builder it runs on, recording when each role's actors are ready."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg, self.model_path, self.tokenizer, self.log = cfg, "model", None, []
        self.nodes: dict[str, list[str | None]] = {}

    def learner_group(self, build: Any, wait: bool = True) -> LocalGroup:
        self.log.append("learner actors" + (", built" if wait else ""))  # ranks build when they join (`started`)
        return LocalGroup("learner", [])

    def group(self, role: str, cls: type, n: int, make_kwargs: Any, timeout_s: float, cpus: float,
              gpus: float = 0.0, wait: bool = True) -> LocalGroup:
        self.log.append(f"{role} actors" + (", started" if wait else ""))
        return LocalGroup(role, [])

    def started(self) -> None:
        self.log.append("learner ranks build; every role started")


def start_order(cfg: ExperimentConfig) -> tuple[list[str], dict[str, Any]]:
    """The order `ExperimentBuilder.start` starts the groups of the online plan in, and the typed groups."""
    from toolbox.algorithms.base import online_plan
    from toolbox.driver.experiment import ExperimentBuilder

    builder = StartOrderBuilder(cfg)
    groups = ExperimentBuilder.start(builder, online_plan(builder, FakeLearner, ALGO))  # type: ignore[arg-type]
    return builder.log, groups


def test_colocated_engines_start_before_learner_ranks_build() -> None:
    log, _ = start_order(config(rollout={**COLOCATE, **GPU_HALF, "engine": VLLM}, learner=GPU_HALF))
    assert log.index("rollout actors, started") < log.index("learner ranks build; every role started")
    log, groups = start_order(config())
    assert log == ["learner actors", "rollout actors", "reward actors", "learner ranks build; every role started"]
    assert (type(groups["learner"]), type(groups["rollout"]), type(groups["reward"])) == (
        PolicyLearnerGroup, RolloutGroup, RewardGroup)  # split: every role starts at once, each typed
    log, groups = start_order(config(reward={"num_workers": 0}))  # the rollout workers score their own batches
    assert "reward actors" not in log and groups["reward"].group is groups["rollout"].group
