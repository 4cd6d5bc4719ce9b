"""`RolloutWorker`: a Ray actor shell around an `InferenceEngine`."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from toolbox.core.retry import take_retries
from toolbox.core.seeding import rng_state, set_rng_state
from toolbox.engines import SamplingConfig
from toolbox.engines.base import WakesInStages, device_syncable, sleep_engine, wake_engine
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.rl.shared_weights import SharedPool, SharedWeightsReader, SharedWeightsUnavailable

from .resolve import node_info, resolve
from .supervisor import recover, remember, remember_pool

if TYPE_CHECKING:
    from .reward import RewardWorker


class RolloutWorker:
    """Generates rollouts and loads new weights; the driver only ever holds refs to its batches."""

    def __init__(self, rank: int, build: Callable[[int], Any], torch_threads: int = 1,
                 supervisor: str | None = None, scorer: Callable[[], RewardWorker] | None = None) -> None:
        """``supervisor`` (the name of a restartable group's `Supervisor`): after a restart by Ray, the weights
        this rank had loaded are loaded again before any retried call runs. ``scorer`` (``reward.num_workers: 0``)
        builds the reward that scores this worker's batches in its own process (a `RewardWorker` object)."""
        self.scorer = scorer() if scorer is not None else None  # before the thread count: it sets its own
        torch.set_num_threads(torch_threads)
        self.rank, self.supervisor = rank, supervisor
        self.engine = build(rank)
        self.asleep = False  # `sleep` / `wake`: a colocated engine frees its memory while the learner trains
        self.reader: SharedWeightsReader | None = None  # the shared-memory weight sync, once open
        previous = recover(supervisor, rank)
        if previous and isinstance(previous[0], bytes):  # the pool: the generation the dead process held is pinned
            self.open_shared_sync(pickle.loads(previous[0]), recovering=True)
        elif previous:
            self.engine.update_weights(resolve(previous))

    def ready(self) -> dict[str, str]:
        return node_info()

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig, sleep_after: bool = False) -> RolloutBatch:
        """The batch itself: Ray stores it, and the driver passes the ref on to reward and learner calls.
        ``sleep_after``: the engine sleeps before the batch is returned, so whatever waits for the batch (the
        colocated learner's update) starts with the engine's memory free."""
        self.wake()
        start = time.perf_counter()
        batch = self.engine.generate(requests, sampling)
        batch.seconds, batch.retries = time.perf_counter() - start, take_retries()
        if sleep_after:
            self.sleep()
        return batch

    def generate_steps(self, requests_per_step: list[list[PromptRequest]],
                       sampling: SamplingConfig) -> tuple[RolloutBatch, ...]:
        """Several steps' requests in one engine call (a larger decode batch per weight read), handed back as one
        batch per step (`split_rows`); each step's ``seconds`` is its share of the call by rows."""
        self.wake()
        start = time.perf_counter()
        batch = self.engine.generate([r for requests in requests_per_step for r in requests], sampling)
        return split_rows(batch, [len(requests) for requests in requests_per_step], time.perf_counter() - start)

    def score(self, batch: RolloutBatch) -> RewardResult:
        """``reward.num_workers: 0``: `RewardWorker.score` in this process, with no reward actor and no hop (the
        batch, this worker's own, is resolved from its store). Runs between this worker's engine calls."""
        if self.scorer is None:
            raise RuntimeError(f"rollout worker {self.rank} holds no reward (reward.num_workers > 0: the reward "
                               "workers score)")
        return self.scorer.score(batch)

    def update_weights(self, bucket_refs: list[Any]) -> float:
        """Load the exported buckets; returns the seconds it took."""
        seconds = self._load(lambda: self.engine.update_weights(resolve(bucket_refs)))
        remember(self.supervisor, self.rank, bucket_refs)
        return seconds

    def _load(self, load: Callable[[], Any]) -> float:
        """Run a weight load in an awake engine; returns its seconds. A sleeping engine with a two-stage wake (vLLM:
        `wake_weights`) takes back only its weights' memory before the load and the rest (KV cache) after it;
        others wake whole first (vLLM's level-1 sleep keeps the weights on the host meanwhile)."""
        if self.asleep and isinstance(self.engine, WakesInStages):
            self.engine.wake_weights()
        else:
            self.wake()
        start = time.perf_counter()
        load()
        seconds = time.perf_counter() - start
        self.wake()
        return seconds

    # ---- device-to-device weight sync (toolbox.engines.nccl_sync; the driver side is toolbox.actors.device_sync)
    def sync_workers(self) -> int:
        """The NCCL ranks this worker's engine takes in the sync group (its tensor-parallel workers)."""
        return device_syncable(self.engine).sync_workers

    def open_weight_sync(self, init_info: dict[str, Any], manifest: list[Any]) -> None:
        """Join learner rank 0's NCCL group (concurrently with the learner's `open_weight_sync`)."""
        device_syncable(self.engine).open_device_sync(init_info, manifest)

    def receive_weights(self, generation: int = 0) -> float:
        """One NCCL round from learner rank 0 (whose `send_weights` runs meanwhile), or with the shared-memory sync
        open the pool's ``generation`` (rank 0's `send_weights` result; unused over NCCL); returns the seconds it
        took."""
        if self.reader is not None:
            return self._receive_shared(generation)
        return self._load(device_syncable(self.engine).receive_weights)

    # ---- same-node shared-memory weight sync (toolbox.rl.shared_weights; the driver side is toolbox.actors.shared_sync)
    def open_shared_sync(self, pool: SharedPool, timeout_s: float = 600.0, recovering: bool = False) -> str:
        """Attach to learner rank 0's pool; returns why it cannot be opened from here ("" when attached). The
        group's records keep the pool (`toolbox.actors.supervisor`): a restarted process attaches again and loads
        the generation its predecessor held (`recovering`), whose slot stays pinned until this rank moves on."""
        try:
            self.reader = SharedWeightsReader(pool, self.rank)
        except SharedWeightsUnavailable as err:
            return str(err)
        self.shared_timeout_s = timeout_s
        held = self.reader.held()
        if recovering and held:
            self.engine.update_weights(self.reader.wait(held, timeout_s))
            self.reader.hold(held)
        self.pool_remembered = recovering
        return ""

    def _receive_shared(self, generation: int) -> float:
        """``generation``, once published, loaded; returns the sync's own seconds: the learner's write of the slot
        and this load, not the wait for the learner (its update). A generation this rank already holds (a call retried
        on a restarted process that recovered it) loads nothing."""
        assert self.reader is not None
        reader = self.reader
        if generation <= reader.generation:
            return 0.0
        buckets = reader.wait(generation, self.shared_timeout_s)
        seconds = self._load(lambda: self.engine.update_weights(buckets)) + reader.copy_s
        reader.hold(generation)
        if not self.pool_remembered:  # once per pool: the generation a restart reloads is in the pool itself
            remember_pool(self.supervisor, self.rank, pickle.dumps(reader.pool))
            self.pool_remembered = True
        return seconds

    def sleep(self) -> None:
        """Free the engine's accelerator memory (a no-op for engines without `sleep`)."""
        if not self.asleep:
            sleep_engine(self.engine)
            self.asleep = True

    def wake(self) -> None:
        """Take the memory back if asleep. generate and update_weights call it first, so the wake of a step is
        chained behind the learner's export (update_weights waits for it) and a step retried after a failure never
        finds a sleeping engine."""
        if self.asleep:
            wake_engine(self.engine)
            self.asleep = False

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.engine.state_dict()

    def get_state(self) -> dict[str, Any]:
        """This process's RNG streams, for a checkpoint: the hf engine samples with the global torch generator
        (seeded once at start), so these are the rollout sampling state."""
        return {"rng": rng_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        set_rng_state(state["rng"])


def split_rows(batch: RolloutBatch, sizes: list[int], seconds: float) -> tuple[RolloutBatch, ...]:
    """``batch`` cut into consecutive parts of ``sizes`` rows, each without the padding columns none of its rows
    needs (so a part is shaped as if generated alone); ``seconds`` shared out by rows, the call's retries carried by
    the first part."""
    parts = [part.trimmed() for part in batch.split_sizes(sizes)]
    for i, part in enumerate(parts):
        part.seconds = seconds * len(part) / max(1, len(batch))
        part.retries = 0 if i else take_retries()
    return tuple(parts)
