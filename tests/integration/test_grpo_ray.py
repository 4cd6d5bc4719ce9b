"""GRPO on a real local Ray: 2 rollout workers, 2 reward workers, 2 FSDP2 learner ranks (gloo)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from toolbox.actors.calls import Args
from toolbox.actors.group import WorkerGroup
from toolbox.actors.learner import LearnerWorker
from toolbox.actors.rollout import RolloutWorker

from toolbox.config import load_config
from toolbox.core.errors import WorkerError
from toolbox.driver.experiment import ExperimentBuilder
from toolbox.models.loading import load_causal_lm

pytestmark = pytest.mark.integration


def build(tmp_path: Path, *overrides: str) -> tuple[ExperimentBuilder, Any]:
    cfg = load_config(["experiment=grpo_tiny_fsdp2", f"trainer.run_root={tmp_path}", "callbacks=[]", "trainer.eval_every=0",
                       *overrides])
    builder = ExperimentBuilder(cfg)
    return builder, builder.build_trainer()


@contextmanager
def counted_run(tmp_path: Path, prompts_per_step: int, monkeypatch: pytest.MonkeyPatch
                ) -> Iterator[tuple[ExperimentBuilder, Any, dict[str, Any], int, list[int]]]:
    """A 3-step GRPO run (2 rollout, 2 reward, 2 FSDP2 ranks) that counts the serialized bytes of everything the
    driver fetched from workers and the driver's waits inside each step (generate -> score -> plan -> update ->
    export -> load weights chain by ref); yields (builder, trainer, summary, bytes, waits) before shutdown."""
    from toolbox.actors.calls import RayWaiter

    received: list[int] = []
    waits: list[int] = []  # per training step: the driver's waits inside it
    in_step = [False]
    original_get, original_wait = ray.get, RayWaiter.wait

    def counting_get(refs: Any, *args: Any, **kwargs: Any) -> Any:
        values = original_get(refs, *args, **kwargs)
        received.append(len(ray.cloudpickle.dumps(values)))
        return values

    def counting_wait(self: RayWaiter, pendings: Any) -> None:
        if in_step[0]:
            waits[-1] += 1
        original_wait(self, pendings)

    builder, trainer = build(tmp_path, f"algorithm.prompts_per_step={prompts_per_step}", "trainer.total_steps=3",
                             "rollout.num_workers=2", "reward.num_workers=2", "learner.num_workers=2",
                             "learner.strategy=fsdp2", "rollout.sampling.max_new_tokens=8",
                             "trainer.log_samples_every=0")
    train_step = trainer.train_step

    def step(n: int) -> dict[str, float]:
        waits.append(0)
        in_step[0] = True
        try:
            return train_step(n)
        finally:
            in_step[0] = False

    monkeypatch.setattr(trainer, "train_step", step)
    monkeypatch.setattr(RayWaiter, "wait", counting_wait)
    try:
        monkeypatch.setattr(ray, "get", counting_get)  # every fetch of the driver goes through ray.get
        try:
            summary = trainer.fit()
        finally:
            monkeypatch.setattr(ray, "get", original_get)
        yield builder, trainer, summary, sum(received), waits
    finally:
        monkeypatch.setattr(ray, "get", original_get)
        builder.shutdown()


def test_rollout_weights_equal_learner_bit_for_bit_and_the_driver_holds_no_batches(
        ray_session: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After 3 steps every rollout worker holds the learner's weights bit for bit; the driver waits once per step
    and fetches the same bytes for 8 and for 64 prompts a step (it only sees refs and metric dicts)."""
    with counted_run(tmp_path / "small", 8, monkeypatch) as (builder, trainer, summary, small, small_waits):
        assert summary["steps"] == 3
        # The full-state gather is collective: every rank takes part, rank 0 gets the tensors.
        learner_sd = trainer.learner.group.each(LearnerWorker.full_state_dict).result()[0]
        initial = load_causal_lm(builder.model_path).state_dict()
        assert any(not torch.equal(learner_sd[k], initial[k]) for k in initial), "the learner did not train"
        for rank, rollout_sd in enumerate(trainer.rollout.group.each(RolloutWorker.state_dict).result()):
            assert rollout_sd.keys() == learner_sd.keys()
            for name, tensor in learner_sd.items():
                assert torch.equal(rollout_sd[name], tensor), f"rollout rank {rank}: {name} differs from the learner"
        assert (Path(summary["last_checkpoint"]) / ".metadata").exists()
    with counted_run(tmp_path / "large", 64, monkeypatch) as (_, _, _, large, large_waits):
        pass
    # 64 prompts x 8 samples x (prompt + 8 response tokens) would be >100 kB of tensors; the driver only sees refs
    # and metric dicts, whose size does not depend on the batch. (Recorded samples are off here: they are a fixed
    # number of rows, but their decoded text varies in length from run to run.)
    assert large - small < 4_000, (small, large)
    assert small_waits == large_waits == [1, 1, 1]


class Sleeper:
    """A worker whose calls can hang, to prove the group fails instead of waiting forever."""

    def ready(self) -> dict[str, str]:
        return {"node_ip": ray.util.get_node_ip_address()}

    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def test_stuck_worker_raises_naming_role_rank_and_node(ray_session: None) -> None:
    group = WorkerGroup("sleeper", Sleeper, 2, lambda r: {}, timeout_s=1.5, cpus=0.1)
    try:
        with pytest.raises(WorkerError, match=r"sleeper rank 1 on node [0-9.]+: nap did not finish within 1.5s"):
            group.call(Sleeper.nap, [Args(0.0), Args(30.0)])
    finally:
        group.shutdown()


def _wait_until_dead(actor: Any, within_s: float = 60.0) -> None:
    """The kill is asynchronous: a call made just after it may still run, so poll until calls fail."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ready.remote(), timeout=within_s)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.2)
    pytest.fail(f"the killed actor still answered after {within_s}s")


def test_dead_worker_raises_naming_role_and_rank(ray_session: None) -> None:
    group = WorkerGroup("sleeper", Sleeper, 2, lambda r: {}, timeout_s=10, cpus=0.1)
    try:
        ray.kill(group.actors[0], no_restart=True)
        _wait_until_dead(group.actors[0])
        with pytest.raises(WorkerError, match=r"sleeper rank 0 on node [0-9.]+: nap died"):
            group.call(Sleeper.nap, [Args(0.0), Args(0.0)])
    finally:
        group.shutdown()
