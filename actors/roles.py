"""Typed role groups: one small facade per role over a `WorkerGroup` / `LocalGroup`.

Trainers call these methods (checked by mypy against `toolbox.trainers.roles`), never
a group method by name. Methods return `Pending` results at once, so calls chain:
``score`` starts on a shard as soon as that shard's ``generate`` finished, ``update``
as soon as the step's scores are in, and ``update_weights`` as soon as the learner
exported. Each facade states its conformance by subclassing the Protocol it implements.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from toolbox.core.pending import Kept, Pending, T
from toolbox.engines.base import SamplingConfig
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.tracing.entries import StepSamples, TraceRequest
from toolbox.trainers.roles import (
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

from .group import LocalGroup, WorkerGroup

Group = WorkerGroup | LocalGroup
log = logging.getLogger(__name__)


class RoleGroup:
    """The workers of one role."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def __len__(self) -> int:
        return len(self.group)

    def broadcast(self, method: str, *args: Any) -> Pending[Any]:
        """The same call on every rank (collective methods of learner ranks, weight loads of engines)."""
        return self.group.submit(method, [args] * len(self.group))

    def states(self) -> list[Any]:
        """Each worker's ``get_state()`` (RNG streams and the like, for a checkpoint), in rank order."""
        return list(self.broadcast("get_state").result())

    def load_states(self, states: list[Any]) -> None:
        """Worker ``i`` gets ``states[i]`` back; with another worker count the saved states are not restored."""
        if len(states) != len(self):
            log.warning("%s: the checkpoint holds the state of %d workers, this run has %d: their RNG streams "
                        "start fresh, so the resumed run is not bit-exact", self.group.role, len(states), len(self))
            return
        self.group.submit("set_state", [(s,) for s in states]).result()

    def hold(self, kept: Kept[T]) -> Pending[T]:
        """Results of this role's calls kept by value (a checkpoint's batches in flight), handed back as a pending."""
        return self.group.hold(kept)

    def restarts(self) -> int:
        """How many times a worker of this role died and was restarted (self-healing groups; 0 otherwise)."""
        return self.group.restarts()

    def shutdown(self) -> None:
        self.group.shutdown()


class EngineGroup(RoleGroup):
    """Workers that hold a copy of the policy and load the learner's exported weights."""

    device_sync = False  # set by toolbox.actors.device_sync.open_nccl_sync: weights arrive over NCCL

    def update_weights(self, weights: Pending[WeightRefs]) -> Pending[float]:
        """Every worker loads rank 0's buckets once the export finished (its next call waits for this one).
        With `device_sync` every worker receives learner rank 0's broadcast instead, without waiting for the export
        call (which is the send, running at the same time)."""
        if self.device_sync:
            return self.broadcast("receive_weights")
        return self.broadcast("update_weights", weights.handles[0])


class RolloutGroup(EngineGroup, RolloutRole):
    """Rollout workers (`toolbox.actors.rollout.RolloutWorker`)."""

    def generate(self, shards: Sequence[list[PromptRequest]], sampling: SamplingConfig,
                 sleep_after: bool = False) -> Pending[RolloutBatch]:
        """Shard ``i`` goes to worker ``i % n``; each call's result is the batch itself (kept in the object store).
        ``sleep_after``: the engine sleeps before the batch is handed back (`RolloutRole.generate`)."""
        tail = (True,) if sleep_after else ()
        return self.group.submit("generate", [(shard, sampling, *tail) for shard in shards], bulk=True)

    def generate_steps(self, steps: Sequence[Sequence[list[PromptRequest]]],
                       sampling: SamplingConfig) -> list[Pending[RolloutBatch]]:
        """Worker ``i`` samples every step's shard ``i`` in one call and returns each step's batch as its own
        object, so a step's reward and learner calls take only that step's rows."""
        per_worker = [([step[i] for step in steps], sampling) for i in range(len(steps[0]))]
        return self.group.submit_parts("generate_steps", per_worker, len(steps), bulk=True)


class EnvRunnerGroup(EngineGroup, EnvRunnerRole):
    """Env runners (`toolbox.actors.env_runner.EnvRunnerWorker`)."""

    def rollout(self, steps_per_env: int) -> Pending[EnvRollout]:
        return self.broadcast("rollout", steps_per_env)

    def evaluate(self, counts: list[int], seeds: list[int]) -> list[list[float]]:
        return self.group.submit("evaluate", list(zip(counts, seeds))).result()


class RewardGroup(RoleGroup, RewardRole):
    """Reward workers (`toolbox.actors.reward.RewardWorker`)."""

    def score(self, batches: Pending[RolloutBatch]) -> Pending[RewardResult]:
        """One call per rollout shard, spread over the workers; each starts when its shard is ready.

        Results grow with the batch, so a wait does not fetch them (the learner's plan reads them).
        """
        return self.group.submit("score", [(ref,) for ref in batches.handles], bulk=True)


class LearnerGroupBase(RoleGroup):
    """What every learner group does: checkpoints (collective; rank 0's answer stands for all) and weight export."""

    def save(self, path: str) -> str:
        return str(self.broadcast("save", path).result()[0])

    def load(self, path: str) -> int:
        return int(self.broadcast("load", path).result()[0])

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
            return self.group.submit("send_weights", [()] * len(self.group), timeout_s=self.sync_timeout_s)
        return self.broadcast("export_weights")

    def export_hf(self, path: str) -> str:
        """The policy as a Hugging Face model directory at ``path`` (every rank gathers, rank 0 writes); waits."""
        return str(self.broadcast("export_hf", path).result()[0])

    def profile(self, directory: str | None) -> list[str]:
        """Every rank starts a ``torch.profiler`` trace into ``directory`` (queued before the step's calls, so
        it records them), or with ``None`` stops and writes it; waits, and returns the traces written."""
        return [str(p) for p in self.broadcast("profile", directory).result() if p]


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
        args = (batches.handles, rewards.handles, keep_groups) + (() if trace is None else (trace,))
        self._updated = True
        if len(self.group) == 1:
            self._plan = None  # kept by the rank (`LearnerWorker.plan_and_update`)
            return self.group.submit("plan_and_update", [args])
        self._plan = self.group.submit("plan", [args], ranks=[0])
        return self.broadcast("update_planned", self._plan.handles[0], batches.handles)

    def samples(self) -> Pending[StepSamples | None]:
        """Rank 0 hands back the samples its last plan recorded (a small call, queued after its update)."""
        if not self._updated:
            raise RuntimeError("samples() before any update(): there is no plan to take them from")
        return self.group.submit("samples", [(() if self._plan is None else (self._plan.handles[0],))], ranks=[0])


class OfflineLearnerGroup(LearnerGroupBase, OfflineLearnerRole):
    """Learner ranks over a fixed dataset: each builds its share of a step from the step index."""

    def update(self, step: int) -> Metrics:
        # Every rank returns the same globally reduced metrics; rank 0's stand for all.
        return self.broadcast("update", step).result()[0]

    def evaluate(self) -> Metrics:
        return self.broadcast("evaluate").result()[0]


class EnvLearnerGroup(LearnerGroupBase, EnvLearnerRole):
    """Learner ranks of classic RL (`toolbox.algorithms.ppo_env.learner.PPOEnvLearner` in each)."""

    def update(self, rollouts: Sequence[EnvRollout]) -> Pending[Metrics]:
        return self.broadcast("update", [r.batch for r in rollouts])
