"""Typed role groups: one small facade per role over a `WorkerGroup` / `LocalGroup`.

Trainers call these methods (checked by mypy against `toolbox.rl.roles`), and these
call the workers' own methods (``self.group.submit(RolloutWorker.generate, ...)``), so
mypy checks each hop from the trainer to the worker. Where two worker classes serve one
role (a reward group of `RewardWorker`s, or of `RolloutWorker`s scoring their own batches),
a Protocol here says what the role calls. Methods return `Pending` results at once, so calls chain:
``score`` starts on a shard as soon as that shard's ``generate`` finished, ``update``
as soon as the step's scores are in, and ``update_weights`` as soon as the learner
exported. Each facade states its conformance by subclassing the Protocol it implements.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Generic, Protocol

from toolbox.core.pending import Kept, Pending, T
from toolbox.engines.base import SamplingConfig
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.rl.roles import (
    EnvLearnerRole,
    EnvRollout,
    EnvRunnerRole,
    Metrics,
    OfflineLearnerRole,
    PolicyLearnerRole,
    RewardRole,
    RolloutRole,
    WeightRefs,
)
from toolbox.tracing.entries import StepSamples, TraceRequest

from .calls import Args, W
from .env_runner import EnvRunnerWorker
from .group import LocalGroup, WorkerGroup
from .learner import LearnerWorker
from .rollout import RolloutWorker

Group = WorkerGroup[W] | LocalGroup[W]
log = logging.getLogger(__name__)


class StatefulWorker(Protocol):
    """A worker whose state (RNG streams) a checkpoint keeps: rollout, reward and env workers."""

    def get_state(self) -> dict[str, Any]: ...

    def set_state(self, state: dict[str, Any]) -> None: ...


class ScoringWorker(StatefulWorker, Protocol):
    """What a reward group calls: a `RewardWorker`, or a `RolloutWorker` scoring its own batches (reward.num_workers: 0)."""

    def score(self, batch: RolloutBatch) -> RewardResult: ...


class WeightLoadingWorker(StatefulWorker, Protocol):
    """A worker holding a copy of the policy: it loads the learner's exported buckets (rollout and env workers)."""

    def update_weights(self, bucket_refs: list[Any]) -> float: ...


class RoleGroup(Generic[W]):
    """The workers of one role."""

    def __init__(self, group: Group[W]) -> None:
        self.group = group

    def __len__(self) -> int:
        return len(self.group)

    def states(self: RoleGroup[StatefulWorker]) -> list[Any]:
        """Each worker's ``get_state()`` (RNG streams and the like, for a checkpoint), in rank order."""
        return list(self.group.each(StatefulWorker.get_state).result())

    def load_states(self: RoleGroup[StatefulWorker], states: list[Any]) -> None:
        """Worker ``i`` gets ``states[i]`` back; with another worker count the saved states are not restored."""
        if len(states) != len(self):
            log.warning("%s: the checkpoint holds the state of %d workers, this run has %d: their RNG streams "
                        "start fresh, so the resumed run is not bit-exact", self.group.role, len(states), len(self))
            return
        self.group.submit(StatefulWorker.set_state, [Args(s) for s in states]).result()

    def hold(self, kept: Kept[T]) -> Pending[T]:
        """Results of this role's calls kept by value (a checkpoint's batches in flight), handed back as a pending."""
        return self.group.hold(kept)

    def restarts(self) -> int:
        """How many times a worker of this role died and was restarted (self-healing groups; 0 otherwise)."""
        return self.group.restarts()

    def shutdown(self) -> None:
        self.group.shutdown()


class EngineGroup(RoleGroup[W]):
    """Workers that hold a copy of the policy and load the learner's exported weights."""

    device_sync = False  # set by toolbox.actors.device_sync.open_nccl_sync: weights arrive over a device path
    shared_sync = False  # set by toolbox.actors.shared_sync.open_shared_sync: weights arrive through shared memory

    def update_weights(self: EngineGroup[WeightLoadingWorker], weights: Pending[WeightRefs]) -> Pending[float]:
        """Every worker loads rank 0's buckets once the export finished (its next call waits for this one)."""
        self.group.keep_refs()  # a self-healing worker's restart reloads these refs (`toolbox.actors.supervisor`)
        # The ref itself, not its value: Ray resolves only top-level refs, and the worker fetches the buckets
        return self.group.each(WeightLoadingWorker.update_weights, weights.handles[0])


class RolloutGroup(EngineGroup[RolloutWorker], RolloutRole):
    """Rollout workers (`toolbox.actors.rollout.RolloutWorker`)."""

    def update_weights(self, weights: Pending[WeightRefs]) -> Pending[float]:
        """As `EngineGroup.update_weights`; with `device_sync` every worker receives learner rank 0's broadcast
        instead, without waiting for the export call (which is the send, running at the same time)."""
        if self.shared_sync:
            # Rank 0's generation once it is written: the call leaves the driver only then, so a restarted worker's
            # retried calls (its generate) keep their place before it
            return self.group.each(RolloutWorker.receive_weights, weights.handles[0])
        if self.device_sync:
            return self.group.each(RolloutWorker.receive_weights)
        return super().update_weights(weights)

    def generate(self, shards: Sequence[list[PromptRequest]], sampling: SamplingConfig,
                 sleep_after: bool = False) -> Pending[RolloutBatch]:
        """Shard ``i`` goes to worker ``i % n``; each call's result is the batch itself (kept in the object store).
        ``sleep_after``: the engine sleeps before the batch is handed back (`RolloutRole.generate`)."""
        calls = [Args(shard, sampling, True) if sleep_after else Args(shard, sampling) for shard in shards]
        return self.group.submit(RolloutWorker.generate, calls, bulk=True)

    def generate_steps(self, steps: Sequence[Sequence[list[PromptRequest]]],
                       sampling: SamplingConfig) -> list[Pending[RolloutBatch]]:
        """Worker ``i`` samples every step's shard ``i`` in one call and returns each step's batch as its own
        object, so a step's reward and learner calls take only that step's rows."""
        per_worker = [Args([step[i] for step in steps], sampling) for i in range(len(steps[0]))]
        return self.group.submit_parts(RolloutWorker.generate_steps, per_worker, len(steps), bulk=True)


class EnvRunnerGroup(EngineGroup[EnvRunnerWorker], EnvRunnerRole):
    """Env runners (`toolbox.actors.env_runner.EnvRunnerWorker`)."""

    def rollout(self, steps_per_env: int) -> Pending[EnvRollout]:
        return self.group.each(EnvRunnerWorker.rollout, steps_per_env)

    def evaluate(self, counts: list[int], seeds: list[int]) -> list[list[float]]:
        calls = [Args(n, seed) for n, seed in zip(counts, seeds)]
        return self.group.call(EnvRunnerWorker.evaluate, calls)


class RewardGroup(RoleGroup[ScoringWorker], RewardRole):
    """Reward workers (`toolbox.actors.reward.RewardWorker`, or rollout workers that score their own batches)."""

    def score(self, batches: Pending[RolloutBatch]) -> Pending[RewardResult]:
        """One call per rollout shard, spread over the workers; each starts when its shard is ready.

        Results grow with the batch, so a wait does not fetch them (the learner's plan reads them).
        """
        # Each ref stands for its batch: Ray hands the worker the batch once that shard is generated.
        calls: list[Args[[RolloutBatch]]] = [Args(ref) for ref in batches.handles]
        return self.group.submit(ScoringWorker.score, calls, bulk=True)


class LearnerGroupBase(RoleGroup[LearnerWorker]):
    """What every learner group does: checkpoints (collective; rank 0's answer stands for all) and weight export."""

    def save(self, path: str) -> str:
        return self.group.each(LearnerWorker.save, path).result()[0]

    def load(self, path: str) -> int:
        return self.group.each(LearnerWorker.load, path).result()[0]

    def restart(self) -> bool:
        """Every rank anew, joined in a new process group (``learner.max_restarts`` bounds it); ``False``: not
        done (spent, or in-process). The caller loads a checkpoint into them."""
        return self.group.replace_all()

    device_sync = False  # set by toolbox.actors.device_sync.open_nccl_sync: weights leave over NCCL
    sync_timeout_s: float | None = None  # with device_sync: the send's deadline (it may wait behind a generate)

    def export_weights(self) -> Pending[WeightRefs]:
        """Every rank takes part in gathering the full weights; rank 0's result holds the bucket refs. With
        `device_sync` rank 0 broadcasts them to the engines instead (results: the bytes sent, no refs), within
        `sync_timeout_s`."""
        if self.device_sync:
            sent = self.group.submit(LearnerWorker.send_weights, [Args()] * len(self.group), timeout_s=self.sync_timeout_s)
            return sent  # type: ignore[return-value]  # the bytes sent: `update_weights` with device_sync reads none
        return self.group.each(LearnerWorker.export_weights)

    def export_hf(self, path: str) -> str:
        """The policy as a Hugging Face model directory at ``path`` (every rank gathers, rank 0 writes); waits."""
        return self.group.each(LearnerWorker.export_hf, path).result()[0]

    def profile(self, directory: str | None) -> list[str]:
        """Every rank starts a ``torch.profiler`` trace into ``directory`` (queued before the step's calls, so
        it records them), or with ``None`` stops and writes it; waits, and returns the traces written."""
        return [p for p in self.group.each(LearnerWorker.profile, directory).result() if p]


class PolicyLearnerGroup(LearnerGroupBase, PolicyLearnerRole):
    """Learner ranks of an online policy algorithm (`toolbox.actors.learner.LearnerWorker`)."""

    _plan: Pending[Any] | None = None  # the last update's plan (rank 0's), which holds its recorded samples
    _updated = False

    def update(self, batches: Pending[RolloutBatch], rewards: Pending[RewardResult],
               keep_groups: list[int] | None = None, trace: TraceRequest | None = None) -> Pending[Metrics]:
        """Rank 0 plans the step once (group statistics, each rank's rows); every rank then fetches its own rows.
        A group of one rank does both in one call.

        With ``trace``, rank 0's plan also records a few samples; `samples` hands them back.
        """
        shards, scores = batches.handles, rewards.handles  # refs: each rank fetches only its rows
        self._updated = True
        if len(self.group) == 1:
            self._plan = None  # kept by the rank (`LearnerWorker.plan_and_update`)
            return self.group.submit(LearnerWorker.plan_and_update, [Args(shards, scores, keep_groups, trace)])
        self._plan = self.group.submit(LearnerWorker.plan, [Args(shards, scores, keep_groups, trace)], ranks=[0])
        # Rank 0's plan by its ref: Ray hands every rank the plan itself once rank 0 made it
        return self.group.each(LearnerWorker.update_planned, self._plan.handles[0], batches.handles)

    def samples(self) -> Pending[StepSamples | None]:
        """Rank 0 hands back the samples its last plan recorded (a small call, queued after its update)."""
        if not self._updated:
            raise RuntimeError("samples() before any update(): there is no plan to take them from")
        plan = None if self._plan is None else self._plan.handles[0]  # None: the rank's own last plan
        return self.group.submit(LearnerWorker.samples, [Args(plan)], ranks=[0])


class OfflineLearnerGroup(LearnerGroupBase, OfflineLearnerRole):
    """Learner ranks over a fixed dataset: each builds its share of a step from the step index."""

    def update(self, step: int) -> Metrics:
        # Every rank returns the same globally reduced metrics; rank 0's stand for all.
        return self.group.each(LearnerWorker.update_offline, step).result()[0]

    def evaluate(self) -> Metrics:
        return self.group.each(LearnerWorker.evaluate).result()[0]


class EnvLearnerGroup(LearnerGroupBase, EnvLearnerRole):
    """Learner ranks of classic RL (`toolbox.algorithms.ppo_env.learner.PPOEnvLearner` in each)."""

    def update(self, rollouts: Sequence[EnvRollout]) -> Pending[Metrics]:
        # Each runner's batch by its ref: every rank fetches them itself
        return self.group.each(LearnerWorker.update_env, [r.batch for r in rollouts])
