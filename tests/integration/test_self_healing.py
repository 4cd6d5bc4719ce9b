"""Self-healing workers on a real local Ray: SIGKILL of a rollout or a reward worker's process mid-run.

Ray restarts the actor (``max_restarts``) and runs its unfinished calls again; the new rollout process
reloads the weights its predecessor had (`toolbox.actors.supervisor`), never the initial ones. Past the
bound, the death fails loudly as before, naming role, rank and node.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from toolbox.actors.learner import LearnerWorker
from toolbox.actors.rollout import RolloutWorker

from toolbox.config import load_config
from toolbox.core.errors import WorkerError
from toolbox.driver.experiment import ExperimentBuilder
from toolbox.models.loading import load_causal_lm

pytestmark = pytest.mark.integration


def pid_of(actor: Any) -> int:
    return int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60))


def sigkill(pid: int) -> int:
    os.kill(pid, signal.SIGKILL)
    return pid


def test_killed_rollout_and_reward_workers_are_restarted_with_current_weights(ray_session: None,
                                                                               tmp_path: Path) -> None:
    """Step 2: both killed with their calls in flight, both restarted, the step completes. Step 3: the reward
    worker killed again, past ``reward.max_restarts=1``: the run fails naming role, rank and node."""
    # A checkpoint after every step keeps each step's calls from going out before the step before has finished
    # (`OnlineTrainer._submits_next`), so the kills below land in the step that ``trainer.step`` names.
    cfg = load_config(["experiment=grpo_tiny_fsdp2", f"trainer.run_root={tmp_path}", "callbacks=[]", "trainer.eval_every=0",
                       "trainer.save_every=1",
                       "trainer.log_samples_every=0", "trainer.total_steps=3", "rollout.num_workers=1",
                       "reward.num_workers=1", "learner.num_workers=1", "learner.strategy=single",
                       "algorithm.prompts_per_step=4", "rollout.max_restarts=1", "reward.max_restarts=1",
                       "learner.optim.lr=0.01", "learner.optim.weight_decay=0.1",  # decay: the weights move
                       "learner.optim.scheduler=constant"])
    builder = ExperimentBuilder(cfg)
    trainer = builder.build_trainer()
    rollout, reward = trainer.rollout.group, trainer.reward.group
    generate, score = trainer.rollout.generate, trainer.reward.score
    killed: dict[str, int] = {}
    killed_at: list[float] = []
    held: list[Any] = []  # what the restarted rollout process holds when it runs the retried generate
    current: list[dict[str, torch.Tensor]] = []  # the learner's weights during step 2 (after step 1's update)

    def generate_then_kill(*args: Any, **kwargs: Any) -> Any:
        if trainer.step != 1:
            return generate(*args, **kwargs)
        current.append(trainer.learner.group.each(LearnerWorker.full_state_dict).result()[0])
        pid = pid_of(rollout.actors[0])  # asked first: an actor answers calls in order
        pending = generate(*args, **kwargs)
        killed["rollout"] = sigkill(pid)  # step 2's generate is in flight: Ray runs it again on a new process
        held.append(rollout.each(RolloutWorker.state_dict))  # queued right behind the retried generate
        return pending

    def score_then_kill(*args: Any) -> Any:
        if trainer.step == 0:
            return score(*args)
        pid = pid_of(reward.actors[0])
        pending = score(*args)
        killed[f"reward at step {trainer.step + 1}"] = sigkill(pid)
        killed_at.append(time.monotonic())
        return pending

    trainer.rollout.generate, trainer.reward.score = generate_then_kill, score_then_kill  # type: ignore[method-assign]
    try:
        with pytest.raises(WorkerError, match=r"reward rank 0 on node [0-9.]+: score died"):
            trainer.fit()
        failed_in = time.monotonic() - killed_at[-1]
        assert len(trainer.history) == 2 and pid_of(rollout.actors[0]) != killed["rollout"]
        assert [m["rollout_restarts"] for m in trainer.history] == [0.0, 1.0]
        assert [m["reward_restarts"] for m in trainer.history] == [0.0, 1.0]
        initial = load_causal_lm(builder.model_path).state_dict()
        assert any(not torch.equal(current[0][k], initial[k]) for k in initial), "step 1 changed no weight"
        restarted_sd = held[0].result()[0]
        for name, tensor in current[0].items():
            assert torch.equal(restarted_sd[name], tensor), f"the restarted rollout worker generated with a stale {name}"
        step_s = [round(m["step_time_s"], 1) for m in trainer.history]
        print(f"figures: step seconds {step_s} (step 2: both restarted); past the bound: failed {failed_in:.1f}s after "
              "the kill")
    finally:
        builder.shutdown()


@pytest.mark.slow
def test_killed_learner_rank_restarts_the_group_from_the_last_checkpoint(ray_session: None, tmp_path: Path) -> None:
    """Rank 1 of two FSDP2 ranks killed twice: as step 2's checkpoint is about to be written (the group starts
    anew from step_1, redoes step 2 and writes step_2), then in step 3's update (anew from step_2, step 3 done
    again); the run completes."""
    cfg = load_config(["experiment=grpo_tiny_fsdp2", f"trainer.run_root={tmp_path}", "callbacks=[]", "trainer.eval_every=0",
                       "trainer.save_every=1",
                       "trainer.log_samples_every=0", "trainer.total_steps=3", "rollout.num_workers=1",
                       "reward.num_workers=1", "learner.num_workers=2", "learner.strategy=fsdp2",
                       "algorithm.prompts_per_step=4", "learner.micro_batch_size=8", "learner.max_restarts=2"])
    builder = ExperimentBuilder(cfg)
    trainer = builder.build_trainer()
    update, save, prepare = trainer.learner.update, trainer.learner.save, trainer.prepare
    resumed: list[int] = []
    killed_at: list[float] = []
    saved: list[str] = []  # checkpoints written

    def kill_rank_1() -> None:
        sigkill(pid_of(trainer.learner.group.actors[1]))
        killed_at.append(time.monotonic())

    def update_then_kill(*args: Any, **kwargs: Any) -> Any:
        pid = pid_of(trainer.learner.group.actors[1]) if saved[-1:] == ["step_2"] and len(killed_at) == 1 else 0
        pending = update(*args, **kwargs)
        if pid:
            sigkill(pid)
            killed_at.append(time.monotonic())
        return pending

    def kill_then_save(path: str) -> str:
        if path.endswith("step_2.tmp") and not killed_at:
            kill_rank_1()
        done = save(path)
        saved.append(Path(path).stem)
        return done

    def recorded_prepare() -> int:
        resumed.append(prepare())
        return resumed[-1]

    trainer.learner.update, trainer.learner.save = update_then_kill, kill_then_save  # type: ignore[method-assign]
    trainer.prepare = recorded_prepare  # type: ignore[method-assign]
    try:
        summary = trainer.fit()
        assert summary["steps"] == 3 and len(killed_at) == 2
        assert resumed == [0, 1, 2]  # the start, step_1 after the death in step_2's save, step_2 after step 3's
        assert [m["learner_restarts"] for m in trainer.history] == [0.0, 0.0, 2.0]
        assert Path(summary["last_checkpoint"]).name == "step_3"
        assert sorted(p.name for p in (trainer.run_dir / "checkpoints").iterdir()) == [
            "step_2", "step_3"]  # no half-written step_2.tmp left; keep_checkpoints=2 pruned step_1
        print(f"figures: learner rank killed -> step 3 done {trainer.history[-1]['step_time_s']:.1f}s after it began "
              f"(step 2 took {trainer.history[1]['step_time_s']:.1f}s)")
    finally:
        builder.shutdown()


class Probe:
    def __init__(self, supervisor: str | None = None) -> None:  # a self-healing group's workers get its name
        self.supervisor = supervisor

    def ready(self) -> dict[str, str]:
        return {}


def test_a_group_records_in_the_gcs_and_starts_a_supervisor_only_for_object_store_weights(ray_session: None) -> None:
    """A self-healing group runs no extra process until its weights go through the object store (`keep_refs`,
    once); its records (here a pool, as a rank's `remember_pool` writes it) are dropped when it shuts down."""
    from ray.experimental import internal_kv
    from toolbox.actors.group import WorkerGroup
    from toolbox.actors.supervisor import NAMESPACE, remember_pool

    group = WorkerGroup("reward", Probe, 1, lambda r: {}, timeout_s=60, cpus=0.01, max_restarts=1)
    name = group.supervisor_name
    assert name and group.supervisor is None and group.restarts() == 0
    remember_pool(name, 0, b"pool")
    group.keep_refs()
    keeper = group.supervisor
    group.keep_refs()
    assert keeper is not None and group.supervisor is keeper and ray.get(keeper.weights_of.remote(0)) is None
    group.shutdown()
    assert internal_kv._internal_kv_list(f"{name}/", namespace=NAMESPACE) == []
    without = WorkerGroup("reward", Probe, 1, lambda r: {}, timeout_s=60, cpus=0.01)
    without.keep_refs()
    assert without.supervisor_name == "" and without.supervisor is None and without.restarts() == 0
    without.shutdown()
