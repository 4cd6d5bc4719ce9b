"""`LearnerWorker`: one learner rank as a Ray actor. Owns ``torch.distributed`` setup, delegates the rest.

The learner object itself is built by a picklable ``build`` callable *after* the
process group exists (FSDP needs it), so one actor shell serves every algorithm's
learner: GRPO's LLM learner, the gymnasium PPO learner, and so on.

An online step is two calls: `plan` on rank 0 alone reads every shard and computes the
group statistics once; `update(plan, shard_refs)` on every rank fetches only the shards
holding that rank's rows. This is the only place learner-side refs are fetched.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist

from toolbox.core.seeding import seed_everything
from toolbox.engines.nccl_sync import NcclSyncInit, NcclWeightSender, weight_manifest
from toolbox.learner.host_offload import HostOffload
from toolbox.learner.profiling import RankProfiler
from toolbox.learner.ranks import EnvLearner, OfflineLearner, PolicyLearner, RankLearner
from toolbox.learner.strategy import backend_for, peak_memory_gb, resolve_device
from toolbox.learner.throughput import model_dims, peak_flops, train_flops
from toolbox.models.loading import load_tokenizer
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.plan import StepPlan
from toolbox.rl.shared_weights import SharedPool, SharedWeightsWriter
from toolbox.rl.weights import TensorSpec
from toolbox.tracing.entries import StepSamples, TraceRequest
from toolbox.tracing.record import sample_traces

from .resolve import node_info, resolve, share


class LearnerWorker:
    """Joins the process group, builds the learner, and forwards calls with object refs resolved: online steps to a
    `PolicyLearner`, offline ones to an `OfflineLearner`, env steps to an `EnvLearner` (`toolbox.learner.ranks`)."""

    def __init__(self, rank: int, world_size: int, build: Callable[[], RankLearner], distributed: bool,
                 backend: str = "auto", torch_threads: int = 1, seed: int = 0, device: str = "auto",
                 traces: bool = False) -> None:
        """``traces``: the run records samples (``trainer.log_samples_every``), which rank 0 decodes: its tokenizer
        loads in `setup` (transformers imported while the rollout workers still load, instead of inside the first
        step: 0.2 s of the default run's first step on 2 cores). Not in a thread: transformers' lazy imports are not
        safe against a second thread's, and where the workers run in the driver's process (``ray.local_mode``)
        the driver imports it at the same time."""
        torch.set_num_threads(torch_threads)
        self.rank, self.world_size = rank, world_size
        self.build, self.distributed, self.backend, self.seed, self.traces = build, distributed, backend, seed, traces
        # The GPU Ray assigned this actor (CUDA_VISIBLE_DEVICES) is cuda:0 here; no GPU reserved: cpu.
        self.device = resolve_device(device)
        self.learner: RankLearner | None = None
        self.tokenizer: Any = None  # rank 0 decodes recorded samples with the policy's tokenizer
        self.profiler: RankProfiler | None = None  # trainer.profile_steps
        self.dims: tuple[float, int, int] | None = None  # the policy's (parameters, layers, width), for the mfu metric

    def ready(self) -> dict[str, str]:
        return node_info()

    def rendezvous(self) -> tuple[str, int]:
        """An address and a free port on this node for rank 0 to host the process group."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        ip = node_info()["node_ip"]
        return ("127.0.0.1" if ip == "local" else ip), port

    def setup(self, addr: str, port: int, timeout_s: float) -> None:
        if self.distributed:
            backend = backend_for(self.backend, self.device)  # auto: nccl on cuda, gloo on cpu
            os.environ.setdefault("MASTER_ADDR", addr)
            dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                    world_size=self.world_size, timeout=timedelta(seconds=timeout_s))
        seed_everything(self.seed + self.rank)
        self.learner = self.build()
        self.host = host_offload(self.learner)
        if self.traces and self.rank == 0 and isinstance(self.learner, PolicyLearner):
            self._tokenizer()

    def plan(self, shard_refs: list[ray.ObjectRef], reward_refs: list[ray.ObjectRef],
             keep_groups: list[int] | None, trace: TraceRequest | None = None) -> StepPlan:
        """Rank 0 only: fetch the whole step and let the learner plan it (group statistics, each rank's rows).

        With ``trace``, the plan also carries a few recorded samples (decoded here: rank 0 has read the step).
        """
        shards: list[RolloutBatch] = resolve(shard_refs)
        rewards: list[RewardResult] = resolve(reward_refs)
        plan = self._policy_learner().plan(shards, rewards, keep_groups)
        if trace is not None:
            plan.samples = sample_traces(trace, shards, rewards, plan, self._tokenizer())
        return plan

    def samples(self, plan: StepPlan | None = None) -> StepSamples | None:
        """The samples ``plan`` recorded (rank 0's own plan: Ray resolved the ref in this process's store); without
        one, those of the last `plan_and_update`'s plan."""
        plan = plan if plan is not None else self.last_plan
        return None if plan is None else plan.samples

    last_plan: StepPlan | None = None

    def plan_and_update(self, shard_refs: list[ray.ObjectRef], reward_refs: list[ray.ObjectRef],
                        keep_groups: list[int] | None, trace: TraceRequest | None = None) -> dict[str, float]:
        """A group of one rank: `plan` and `update_planned` in one call (an actor call a step fewer, on the rank that
        bounds the step); the plan stays here for `samples`."""
        self.last_plan = self.plan(shard_refs, reward_refs, keep_groups, trace)
        return self.update_planned(self.last_plan, shard_refs)

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self._policy_learner().policy.source)
        return self.tokenizer

    def update_planned(self, plan: StepPlan, shard_refs: list[ray.ObjectRef]) -> dict[str, float]:
        """Online step: ``learner.update(plan, shards)`` with only the shards ``plan`` assigns this rank fetched
        (Ray resolved ``plan`` itself: rank 0's `plan` result); adds ``train_s``, the time this rank took."""
        start = time.perf_counter()
        mine = plan.shards_for(self.rank)
        fetched = resolve([shard_refs[i] for i in mine])
        self._on_device()
        metrics = self._policy_learner().update(plan, dict(zip(mine, fetched)))
        seconds = time.perf_counter() - start
        return {**metrics, "train_s": seconds, "peak_mem_gb": peak_memory_gb(self.device),
                **self._mfu(plan.metrics, seconds)}

    def _mfu(self, counts: dict[str, float], seconds: float) -> dict[str, float]:
        """``mfu``: the model FLOPs of the step's ``train_tokens`` (sequences ``train_seq_len`` long) over what
        ``world_size`` devices could do in this rank's time (`toolbox.learner.throughput`); nothing without a peak
        FLOPs figure for this device."""
        tokens = counts.get("train_tokens", 0.0)
        if not tokens or seconds <= 0:
            return {}
        policy = self._learner.policy
        peak = peak_flops(self.device, policy.cfg.peak_tflops)
        if peak is None:
            return {}
        if self.dims is None:
            self.dims = model_dims(policy.model)
        flops = train_flops(self.dims, tokens, counts.get("train_seq_len", 0.0))
        return {"mfu": flops / (seconds * peak * self.world_size)}

    def update_offline(self, step: int) -> dict[str, float]:
        """Offline step ``step``: every rank builds its share of the global batch from the step index; adds
        ``train_s`` (this rank's time) and ``mfu``."""
        self._on_device()
        start = time.perf_counter()
        metrics = self._offline_learner().update(step)
        seconds = time.perf_counter() - start
        return {**metrics, "train_s": seconds, **self._mfu(metrics, seconds)}

    def update_env(self, batch_refs: list[ray.ObjectRef]) -> dict[str, float]:
        """Env step: PPO epochs on this rank's slice of every env runner's trajectories (fetched here)."""
        self._on_device()
        return self._env_learner().update(resolve(batch_refs))

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics of an offline learner, no update."""
        self._on_device()
        return self._offline_learner().evaluate()

    def export_weights(self) -> list[Any]:
        """Rank 0's buckets (every rank gathers); with ``learner.offload_while_generating`` the state then leaves the
        GPU until the next call that needs it."""
        buckets = [share(bucket) for bucket in self._on_device().policy.export_weights()]
        self._offload()
        return buckets

    # ---- device-to-device weight sync (toolbox.engines.nccl_sync; the driver side is toolbox.actors.device_sync)
    sender: NcclWeightSender | None = None

    def weight_manifest(self, dtype: str = "") -> list[TensorSpec]:
        """Names, dtypes (floating-point ones in ``dtype``, the engines') and shapes the NCCL sync sends, in order
        (announced to the engines once)."""
        return weight_manifest(self._sender().model, dtype)

    def open_weight_sync(self, init: NcclSyncInit) -> None:
        """Every rank: rank 0 joins the NCCL group with the engines' workers (concurrently with their join)."""
        self._sender().open(init)

    def send_weights(self) -> int:
        """Every rank joins the gathers; rank 0 broadcasts to the engines (whose receive runs meanwhile), or, with the
        shared-memory sync open, writes the weights into a free slot of its pool. Then, as after `export_weights`,
        the state may leave the GPU."""
        if self.shared_sync:
            state = self._on_device().policy.full_state_dict()  # every rank joins the gather
            sent = self.writer.publish(state) if self.writer is not None else 0
        else:
            self._on_device()
            sent = self._sender().send()
        self._offload()
        return sent

    # ---- same-node shared-memory weight sync (toolbox.rl.shared_weights; the driver side is toolbox.actors.shared_sync)
    writer: SharedWeightsWriter | None = None
    shared_sync = False

    def open_shared_sync(self, readers: int, dtype: str = "") -> SharedPool | None:
        """Every rank joins the gather; rank 0 lays out its pool for ``readers`` engines, floating-point weights in
        ``dtype`` (the engines'), and returns what they attach to (``None`` elsewhere)."""
        state = self._on_device().policy.full_state_dict()
        self.shared_sync = True
        if self.rank != 0:
            return None
        if self.writer is not None:
            self.writer.close()
        self.writer = SharedWeightsWriter(state, readers, dtype)
        return self.writer.pool

    def _sender(self) -> NcclWeightSender:
        if self.sender is None:
            self.sender = NcclWeightSender(self._learner.policy.model, self.rank)
        return self.sender

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self._on_device().policy.full_state_dict()

    def export_hf(self, path: str) -> str:
        """Collective: every rank joins the gather of the full weights; rank 0 writes the Hugging Face directory."""
        return self._on_device().policy.export_hf(path)

    def save(self, path: str) -> str:
        return str(self._on_device().policy.save(path))

    def profile(self, directory: str | None) -> str:
        """Start recording a ``torch.profiler`` trace into ``directory``, or (``None``) stop and write it;
        returns the trace's path when stopping (`toolbox.learner.profiling`)."""
        if self.profiler is None:
            self.profiler = RankProfiler(self.rank)
        if directory is not None:
            self.profiler.start(directory)
            return ""
        return self.profiler.stop()

    def load(self, path: str) -> int:
        return self._on_device().policy.load(path)

    # ---- learner.offload_while_generating (toolbox.learner.host_offload)
    host: HostOffload | None = None

    def _on_device(self) -> RankLearner:
        """The learner, its state back on the GPU first if it was offloaded after the last export."""
        if self.host is not None:
            self.host.reload()
        return self._learner

    def _offload(self) -> None:
        if self.host is not None:
            self.host.offload()

    @property
    def _learner(self) -> RankLearner:
        if self.learner is None:
            raise RuntimeError(f"learner rank {self.rank} was used before setup()")
        return self.learner

    # The learner as the kind a call needs (`toolbox.learner.ranks`); another kind is a `TypeError` naming both
    # (an online call on an offline learner). One method per kind: a Protocol cannot be a `type[...]` argument.
    def _policy_learner(self) -> PolicyLearner[Any]:
        learner = self._learner
        if isinstance(learner, PolicyLearner):
            return learner
        raise self._not_a(learner, PolicyLearner)

    def _offline_learner(self) -> OfflineLearner:
        learner = self._learner
        if isinstance(learner, OfflineLearner):
            return learner
        raise self._not_a(learner, OfflineLearner)

    def _env_learner(self) -> EnvLearner:
        learner = self._learner
        if isinstance(learner, EnvLearner):
            return learner
        raise self._not_a(learner, EnvLearner)

    def _not_a(self, learner: RankLearner, kind: type) -> TypeError:
        return TypeError(f"learner rank {self.rank}: {type(learner).__name__} is not a {kind.__name__} "
                         "(`toolbox.learner.ranks`), which this call needs")


def host_offload(learner: RankLearner) -> HostOffload | None:
    """The offloader of a learner whose config asks for ``learner.offload_while_generating`` (policy learners)."""
    return HostOffload.of(learner) if learner.policy.cfg.offload_while_generating else None
