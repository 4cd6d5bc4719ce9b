"""What driver loops need of each role: typed Protocols the real role groups (toolbox.actors.roles) and the test
fakes both implement, so mypy holds trainers, groups and fakes together. They sit in the library, below the actors
that implement them and the trainers that call them, so both import down.

Methods return `Pending` results at once; a loop chains them (``reward.score(rollout.generate(...))``)
and waits once per step with `toolbox.core.pending.wait`. Bulk data (batches, rewards,
weights) never reaches the driver: only metric dicts and small values are fetched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from toolbox.core.pending import Kept, Pending, T
from toolbox.engines.base import SamplingConfig
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.tracing.entries import StepSamples, TraceRequest

Metrics = dict[str, float]
WeightRefs = list[Any]  # what a learner exports: bucket refs (CPU object store) for engines to load


class Role(Protocol):
    def __len__(self) -> int: ...

    def restarts(self) -> int:
        """How many times one of the role's workers died and was restarted so far (0 where none can be)."""
        ...


class StatefulRole(Role, Protocol):
    """Workers whose state (RNG streams, episodes in progress) a checkpoint keeps, so a resumed run is exact."""

    def states(self) -> list[Any]:
        """Each worker's state, in rank order (small and picklable)."""
        ...

    def load_states(self, states: list[Any]) -> None:
        """Give worker ``i`` ``states[i]`` back; a different worker count cannot be restored (it says so)."""
        ...

    def hold(self, kept: Kept[T]) -> Pending[T]:
        """Results of this role's calls kept by value (`Pending.keep`: a checkpoint's batches sampled ahead), as a
        pending that later calls take like one of the role's own."""
        ...


class RolloutRole(StatefulRole, Protocol):
    """Generation engines: one shard of prompt requests per worker call."""

    def generate(self, shards: Sequence[list[PromptRequest]], sampling: SamplingConfig,
                 sleep_after: bool = False) -> Pending[RolloutBatch]:
        """With ``sleep_after`` (colocated engines), each worker puts its engine to sleep once its shard is generated
        and before its batch is ready, so a learner update on those batches starts with the engines' memory free;
        the next update_weights or generate wakes them."""
        ...

    def generate_steps(self, steps: Sequence[Sequence[list[PromptRequest]]],
                       sampling: SamplingConfig) -> list[Pending[RolloutBatch]]:
        """Several steps' shards (``steps[j][i]``: step j's shard for worker i) sampled in one engine call per
        worker (``rollout.steps_per_generation``): one pending per step, as `generate` would return for it."""
        ...

    def update_weights(self, weights: Pending[WeightRefs]) -> Pending[float]:
        """Every worker loads rank 0's exported buckets; each result is the seconds the load took."""
        ...


class RewardRole(StatefulRole, Protocol):
    """Reward workers: one call per rollout shard, each starting when that shard is generated."""

    def score(self, batches: Pending[RolloutBatch]) -> Pending[RewardResult]: ...


class CheckpointRole(Role, Protocol):
    """Learner groups save and restore together (collective); both return at once on every rank."""

    def save(self, path: str) -> str: ...

    def load(self, path: str) -> int: ...

    def restart(self) -> bool:
        """After a rank died: every rank started anew, set up as at start (weights as built: load a checkpoint
        next); ``False`` when ``learner.max_restarts`` is spent (or the group cannot restart)."""
        ...

    def export_weights(self) -> Pending[WeightRefs]: ...

    def export_hf(self, path: str) -> str:
        """The policy as a Hugging Face model directory at ``path`` (``from_pretrained`` loads it); returns it."""
        ...

    def profile(self, directory: str | None) -> list[str]:
        """Start a ``torch.profiler`` trace on every rank into ``directory``, or (``None``) stop and write them."""
        ...


class PolicyLearnerRole(CheckpointRole, Protocol):
    """Learners of online policy algorithms (GRPO, PPO, online DPO)."""

    def update(self, batches: Pending[RolloutBatch], rewards: Pending[RewardResult],
               keep_groups: list[int] | None = None, trace: TraceRequest | None = None) -> Pending[Metrics]:
        """Group statistics computed once (rank 0), then every rank trains on its own rows. With ``trace``,
        rank 0 also records a few whole groups of the step (`samples`)."""
        ...

    def samples(self) -> Pending[StepSamples | None]:
        """What rank 0 recorded for the last `update`'s ``trace`` (``None`` without one): a few rows of text."""
        ...


class OfflineLearnerRole(CheckpointRole, Protocol):
    """Learners over a fixed dataset (SFT, DPO): each rank builds its share of step ``step`` itself."""

    def update(self, step: int) -> Metrics: ...

    def evaluate(self) -> Metrics: ...


@dataclass
class EnvRollout:
    """One env runner's share of a step: its trajectory batch by ref (bulk) and its episode stats by value."""

    batch: Any
    steps: int
    returns: list[float]
    lengths: list[int]
    seconds: float


class EnvRunnerRole(StatefulRole, Protocol):
    """Gymnasium env runners: each steps its vector env with the current policy."""

    def rollout(self, steps_per_env: int) -> Pending[EnvRollout]: ...

    def update_weights(self, weights: Pending[WeightRefs]) -> Pending[float]: ...

    def evaluate(self, counts: list[int], seeds: list[int]) -> list[list[float]]:
        """Runner ``i`` plays ``counts[i]`` episodes from seed ``seeds[i]`` with the deterministic policy."""
        ...


class EnvLearnerRole(CheckpointRole, Protocol):
    """Learners of classic RL: every rank reads every runner's (small) batch."""

    def update(self, rollouts: Sequence[EnvRollout]) -> Pending[Metrics]:
        """Every rank trains on the runners' batches (refs inside ``rollouts``, which the loop already fetched)."""
        ...
