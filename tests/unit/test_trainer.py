"""The driver loop (`BaseTrainer.fit` via `OnlineTrainer`) with in-process fake workers in `LocalGroup`s behind the
real typed role groups (`toolbox.actors.roles`): no model, no Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from toolbox.actors.calls import Args
from toolbox.actors.group import LocalGroup
from toolbox.actors.roles import PolicyLearnerGroup, RewardGroup, RolloutGroup

from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.config.trainer import TrainerConfig
from toolbox.core.errors import WorkerError
from toolbox.core.events import Event, EventBus
from toolbox.data.prompts import PromptSource
from toolbox.data.tasks import TASKS
from toolbox.engines.base import SamplingConfig
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import PromptRequest
from toolbox.trainers.base import BaseTrainer
from toolbox.trainers.online import OnlineTrainer

ALGO = GRPOConfig(prompts_per_step=2, group_size=3)


class CharTokenizer:
    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


class FakeRollout:
    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []  # (requests, temperature)
        self.weights: list[Any] = []

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> dict[str, int]:
        """Stands in for a RolloutBatch: it only says how many rows it has."""
        assert all(isinstance(r, PromptRequest) for r in requests)
        self.calls.append((len(requests), sampling.temperature))
        return {"rows": len(requests)}

    def update_weights(self, bucket_refs: list[Any]) -> float:
        self.weights.append(bucket_refs)
        return 0.0

    def get_state(self) -> dict[str, int]:
        return {"calls": len(self.calls)}

    def set_state(self, state: dict[str, int]) -> None:
        self.restored = state


class FakeReward:
    def score(self, batch: dict[str, int]) -> RewardResult:
        n = batch["rows"]
        return RewardResult(torch.full((n,), 0.25), torch.zeros(n, dtype=torch.long), [""] * n)

    def get_state(self) -> dict[str, int]:
        return {}

    def set_state(self, state: dict[str, int]) -> None:
        pass


class FakeLearner:
    """Reward of the k-th update is ``k`` (+ the rank), so summaries and rank averaging are checkable."""

    def __init__(self, rank: int = 0, start: int = 0, fail_at: int | None = None) -> None:
        self.rank, self.start, self.fail_at = rank, start, fail_at
        self.updates, self.saved, self.loaded = 0, [], []

    def plan(self, batches: list[dict[str, int]], rewards: list[RewardResult], keep: list[int] | None,
             trace: Any = None) -> dict[str, Any]:
        """Rank 0 alone plans a step, from every shard and its rewards."""
        assert self.rank == 0 and [b["rows"] for b in batches] == [len(r) for r in rewards]
        return {"shards": len(batches)}

    def samples(self, plan: dict[str, Any] | None = None) -> None:
        """Records no samples (`test_samples.py` checks recording with a real plan)."""
        return None

    def update_planned(self, plan: dict[str, Any], batches: list[dict[str, int]]) -> dict[str, float]:
        assert plan == {"shards": len(batches)}
        if self.fail_at is not None and self.updates == self.fail_at:
            raise RuntimeError("boom")
        self.updates += 1
        return {"reward": float(self.start + self.updates - 1 + self.rank), "loss": 1.0}

    last_plan: dict[str, Any] | None = None

    def plan_and_update(self, batches: list[dict[str, int]], rewards: list[RewardResult], keep: list[int] | None,
                        trace: Any = None) -> dict[str, float]:
        """A group of one rank: both in one call, as `LearnerWorker.plan_and_update`."""
        self.last_plan = self.plan(batches, rewards, keep, trace)
        return self.update_planned(self.last_plan, batches)

    def export_weights(self) -> list[Any]:
        return [f"weights-after-{self.updates}"] if self.rank == 0 else []

    def save(self, path: str) -> str:
        self.saved.append(path)
        return path

    def load(self, path: str) -> int:
        self.loaded.append(path)
        return self.start


class Recorder:
    def __init__(self, bus: EventBus) -> None:
        self.events: list[tuple[Event, dict[str, Any]]] = []
        for event in Event:
            bus.subscribe(event, lambda e, p: self.events.append((e, p)))

    def kinds(self) -> list[tuple[str, int | None]]:
        return [(e.name, p.get("step")) for e, p in self.events]


def make_trainer(tmp_path: Path, learners: list[FakeLearner] | None = None, **cfg: Any) -> tuple[OnlineTrainer, Recorder, dict]:
    bus = EventBus()
    recorder = Recorder(bus)
    workers = {"rollout": [FakeRollout(), FakeRollout()], "reward": [FakeReward(), FakeReward()],
               "learner": learners or [FakeLearner(0), FakeLearner(1)]}
    prompts = PromptSource(TASKS.build({"name": "digit_add"}), CharTokenizer(), seed=0)
    trainer = OnlineTrainer(TrainerConfig(**cfg), bus, ALGO, SamplingConfig(temperature=1.0), prompts,
                            RolloutGroup(LocalGroup("rollout", workers["rollout"])),
                            RewardGroup(LocalGroup("reward", workers["reward"])),
                            PolicyLearnerGroup(LocalGroup("learner", workers["learner"])), tmp_path, experiment="fake")
    return trainer, recorder, workers


def expected_events(start: int, total: int, eval_every: int, save_every: int,
                    rollouts: bool = True) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = [("FIT_START", None)]
    for step in range(start + 1, total + 1):
        out += [("ROLLOUT_END", step), ("STEP_END", step)] if rollouts else [("STEP_END", step)]
        if eval_every and (step % eval_every == 0 or step == total):
            out.append(("EVAL_END", step))
        if step == total or (save_every and step % save_every == 0):
            out.append(("CHECKPOINT_SAVED", step))
    if not eval_every and rollouts and start < total:  # trainer.final_eval: once more after the last checkpoint
        out.append(("EVAL_END", total))
    return out + [("FIT_END", total)]


def test_registered() -> None:
    from toolbox.algorithms import ALGORITHMS

    assert ALGORITHMS.get("grpo").config is GRPOConfig


def test_events_in_order_with_eval_and_save_cadence(tmp_path: Path) -> None:
    trainer, rec, workers = make_trainer(tmp_path, total_steps=10, eval_every=4, save_every=3, eval_prompts=5)
    summary = trainer.fit()
    assert rec.kinds() == expected_events(0, 10, eval_every=4, save_every=3)
    assert rec.events[0][1] == {"start_step": 0, "total_steps": 10}
    # Evaluations at 4, 8 and the last step; checkpoints at 3, 6, 9 and the last step.
    assert [p["step"] for e, p in rec.events if e is Event.EVAL_END] == [4, 8, 10]
    saved = [p["path"] for e, p in rec.events if e is Event.CHECKPOINT_SAVED]
    assert saved == [str(tmp_path / "checkpoints" / f"step_{s}") for s in (3, 6, 9, 10)]
    # Save is collective, into a staging directory renamed once complete; the newest two are kept.
    assert workers["learner"][0].saved == workers["learner"][1].saved == [p + ".tmp" for p in saved]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_10", "step_9"]
    assert all((tmp_path / "checkpoints" / name / "COMPLETE").is_file() for name in ("step_9", "step_10"))
    assert summary["last_checkpoint"] == saved[-1] and summary["steps"] == 10 and summary["experiment"] == "fake"
    # Rollouts: 2 prompts x 3 samples split over 2 workers; evaluation is greedy over eval_prompts.
    assert all(p["rows"] == 6 for e, p in rec.events if e is Event.ROLLOUT_END)
    calls = workers["rollout"][0].calls + workers["rollout"][1].calls
    assert calls.count((3, 1.0)) == 20 and sorted(c for c in calls if c[1] == 0.0) == [(2, 0.0)] * 3 + [(3, 0.0)] * 3
    eval_metrics = [p["metrics"] for e, p in rec.events if e is Event.EVAL_END]
    assert eval_metrics == [{"reward": 0.25}] * 3
    # Weights sync once at start and after every step, to every rollout worker, from learner rank 0.
    for rollout in workers["rollout"]:
        assert rollout.weights == [[f"weights-after-{k}"] for k in range(11)]


def test_step_metrics_are_rank_means(tmp_path: Path) -> None:
    trainer, rec, _ = make_trainer(tmp_path, total_steps=2)
    trainer.fit()
    steps = [p["metrics"] for e, p in rec.events if e is Event.STEP_END]
    assert [m["reward"] for m in steps] == [0.5, 1.5]  # ranks report k and k + 1
    assert all({"loss", "sync_s", "driver_wait_s", "step_time_s"} <= m.keys() for m in steps)


def test_defaults_save_only_at_the_end_and_evaluate_once_after(tmp_path: Path) -> None:
    trainer, rec, _ = make_trainer(tmp_path, total_steps=3)
    trainer.fit()
    assert rec.kinds() == expected_events(0, 3, eval_every=0, save_every=0)
    assert [p.get("final") for e, p in rec.events if e is Event.EVAL_END] == [True]
    quiet, rec, _ = make_trainer(tmp_path / "q", total_steps=3, final_eval=False)
    quiet.fit()
    assert not any(e is Event.EVAL_END for e, _ in rec.events)


def test_summary_first_and_last_ten_percent(tmp_path: Path) -> None:
    trainer, _, _ = make_trainer(tmp_path, total_steps=20, learners=[FakeLearner(0)])
    summary = trainer.fit()
    # Rewards are 0..19: the first 10% is steps 0-1, the last 10% steps 18-19.
    assert summary["reward_first_10pct"] == pytest.approx(0.5)
    assert summary["reward_last_10pct"] == pytest.approx(18.5)
    short, _, _ = make_trainer(tmp_path, total_steps=3, learners=[FakeLearner(0)])
    s = short.fit()  # fewer than 10 steps: one step each
    assert s["reward_first_10pct"] == 0.0 and s["reward_last_10pct"] == 2.0


def test_resume_starts_at_the_loaded_step(tmp_path: Path) -> None:
    learners = [FakeLearner(0, start=3), FakeLearner(1, start=3)]
    trainer, rec, _ = make_trainer(tmp_path, learners=learners, total_steps=5, resume_from="/ckpt/step_3")
    summary = trainer.fit()
    assert learners[0].loaded == learners[1].loaded == ["/ckpt/step_3"]
    assert rec.events[0][1]["start_step"] == 3
    assert rec.kinds() == expected_events(3, 5, eval_every=0, save_every=0)
    assert learners[0].updates == 2 and summary["steps"] == 5


def test_resume_at_the_end_runs_no_step(tmp_path: Path) -> None:
    trainer, rec, _ = make_trainer(tmp_path, learners=[FakeLearner(0, start=4)], total_steps=4, resume_from="x")
    trainer.fit()
    assert rec.kinds() == [("FIT_START", None), ("FIT_END", 4)]


def test_worker_failure_names_role_and_rank(tmp_path: Path) -> None:
    learners = [FakeLearner(0), FakeLearner(1, fail_at=1)]
    trainer, rec, _ = make_trainer(tmp_path, learners=learners, total_steps=3)
    with pytest.raises(WorkerError) as info:
        trainer.fit()
    err = info.value
    assert err.role == "learner" and err.rank == 1
    assert "learner rank 1" in str(err) and "update_planned raised: RuntimeError: boom" in str(err)
    assert [p["step"] for e, p in rec.events if e is Event.STEP_END] == [1]
    assert not any(e is Event.FIT_END for e, _ in rec.events)


def test_local_group_routes_ranks_and_wraps_errors() -> None:
    class Echo:
        def __init__(self, rank: int) -> None:
            self.rank = rank

        def who(self, x: int = 0) -> tuple[int, int]:
            if x < 0:
                raise ValueError("negative")
            return self.rank, x

    group = LocalGroup("reward", [Echo(0), Echo(1), Echo(2)])
    assert len(group) == 3
    assert group.each(Echo.who).result() == [(0, 0), (1, 0), (2, 0)]
    assert group.call(Echo.who, [Args(5), Args(x=6)], ranks=[2, 4]) == [(2, 5), (1, 6)]
    assert group.call(Echo.who, [Args(1)] * 4) == [(0, 1), (1, 1), (2, 1), (0, 1)]  # wraps around the group
    with pytest.raises(WorkerError, match=r"reward rank 2 on node local: who raised: ValueError: negative"):
        group.call(Echo.who, [Args(-1)], ranks=[2])

    class Other:
        def hello(self) -> None: ...

    with pytest.raises(TypeError, match=r"Other\.hello' is not a method of Echo"):  # caught at the call site
        group.each(Other.hello)  # type: ignore[arg-type]


class CountingTrainer(BaseTrainer):
    """The skeleton alone: a subclass writes train_step and save."""

    def train_step(self, step: int) -> dict[str, float]:
        return {"reward": float(step)}

    def save(self, step: int) -> str:
        return f"ckpt-{step}"


def test_base_trainer_skeleton() -> None:
    bus = EventBus()
    rec = Recorder(bus)
    summary = CountingTrainer(TrainerConfig(total_steps=4, save_every=2, eval_every=3), bus, "x").fit()
    assert rec.kinds() == expected_events(0, 4, eval_every=3, save_every=2, rollouts=False)
    assert [p["metrics"] for e, p in rec.events if e is Event.EVAL_END] == [{}, {}]
    assert summary["last_checkpoint"] == "ckpt-4" and summary["reward_last_10pct"] == 3.0
