"""The SGLang engine: ``sglang.Engine`` (offline, in-process), weights synced over NCCL from learner rank 0 or
from CPU buckets with ``update_weights_from_tensor``.

**NCCL** (`toolbox.engines.placement.choose_sync_path` picks it when learner and engine have GPUs of their own):
`SGLangEngine.open_device_sync` joins learner rank 0's group with ``Engine.init_weights_update_group`` (each
tensor-parallel scheduler takes rank ``rank_offset + tp_rank``); `SGLangEngine.receive_weights` runs one round,
``update_weights_from_distributed(..., load_format="flattened_bucket")`` per bucket of the manifest
(`toolbox.engines.nccl_sync.plan_buckets`, the cut the learner broadcasts in) inside one weight-update session.

**CPU buckets** (the object store; CUDA IPC when colocated):
``Engine.update_weights_from_tensor(named_tensors, load_format=None, flush_cache=True)`` serialises the tensors
with torch's multiprocessing reductions (CUDA IPC for GPU tensors, shared memory for CPU ones) to every
tensor-parallel scheduler, which calls ``model.load_weights``. SGLang 0.5.23 refuses it outside a weight-update
session, so a sync is ``begin_weight_update()``, one ``update_weights_from_tensor``
per bucket, ``end_weight_update()`` (which finalises quantized weights into kernel layout). We stage each
bucket on the GPU first, as SGLang's own tests do, and flush the radix cache only after the last bucket.

Behaviour log-probs are SGLang's ``output_token_logprobs``: ``log_softmax(logits / T)`` before
top-k/top-p filtering (unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set, which makes them raw),
the same definition as the hf engine.

Not covered without a GPU: unit tests drive `SGLangEngine` against a fake ``sglang`` module; where SGLang is
installed (``scripts/engine_contracts.sh``) its scheduler's weight updater receives the learner's real broadcast
over gloo, and the CPU-bucket payload goes through its real ``Engine`` and ``TokenizerManager``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from pydantic import ConfigDict, Field

from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.engines.common import (
    ParallelEngineOptions,
    Sample,
    batch_from_samples,
    finish_code,
    tensor_bytes,
    wire_dtype,
)
from toolbox.engines.nccl_sync import plan_buckets
from toolbox.models.loading import load_tokenizer
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.rl.weights import TensorSpec, WeightBucket, unpack_bucket

# sglang.Engine arguments the engine passes itself, and where each is set instead of engine_kwargs.
RESERVED = {"model_path": "model.path", "dtype": "rollout.dtype", "random_seed": "trainer.seed",
            "trust_remote_code": "model.trust_remote_code", "enable_weights_cpu_backup":
            "rollout.engine.weights_cpu_backup", **{k: f"rollout.engine.{k}" for k in
                                                   ("tp_size", "mem_fraction_static", "enable_memory_saver")}}


class SGLangEngineConfig(ParallelEngineOptions):
    """Options of the ``sglang`` engine (passed to ``sglang.Engine``)."""

    model_config = ConfigDict(extra="forbid")
    RESERVED, CALLEE, TP_FIELD, PP_KEY = RESERVED, "sglang.Engine", "tp_size", "pp_size"
    tp_size: int = Field(default=1, ge=1, description="GPUs one engine shards the model over (tensor parallelism).")
    mem_fraction_static: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="Share of GPU memory for weights + KV cache; leaves room for a learner.",
    )
    enable_memory_saver: bool = Field(default=False, description="Allow sleep()/wake() (release/resume GPU memory).")
    weights_cpu_backup: bool = Field(
        default=True,
        description="With enable_memory_saver: SGLang copies the weights to host memory on sleep and back on wake "
        "(its enable_weights_cpu_backup). Off: sleep discards them, and the engine refuses to generate after a wake "
        "until new weights are loaded (saves one host copy of the model, and the copy back).")
    stage_on_gpu: bool = Field(
        default=True,
        description="Copy each weight bucket to the GPU before handing it to SGLang (CUDA IPC); "
        "off: send CPU tensors through shared memory.",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Further keyword arguments for sglang.Engine (SGLang ServerArgs names); not "
        "the ones the engine sets from other settings (dtype: rollout.dtype, random_seed, the fields above). pp_size: "
        "the rollout worker reserves tensor x pipeline GPUs."
    )



@ENGINES.register("sglang", config=SGLangEngineConfig)
class SGLangEngine:
    """Samples with ``sglang.Engine``; behaviour log-probs are SGLang's log-prob of each sampled token."""

    def __init__(self, model_path: str, dtype: str = "float32", config: SGLangEngineConfig | None = None,
                 seed: int = 0, trust_remote_code: bool = False) -> None:
        self.config = config or SGLangEngineConfig()
        self._group = ""  # NCCL: the weight-update group joined by open_device_sync
        self._buckets: list[Sequence[TensorSpec]] = []  # NCCL: the manifest cut into the learner's buckets
        self.dtype = dtype
        self._weights_lost = False  # slept without a host backup: no generate until weights are loaded
        self.tokenizer = load_tokenizer(model_path, trust_remote_code)
        import sglang  # lazy: the module must import where SGLang is not installed

        cfg = self.config
        self.engine = sglang.Engine(
            model_path=model_path,
            dtype=dtype,
            random_seed=seed,
            trust_remote_code=trust_remote_code,
            tp_size=cfg.tp_size,
            mem_fraction_static=cfg.mem_fraction_static,
            enable_memory_saver=cfg.enable_memory_saver,
            # Without the backup SGLang's sleep discards the weights, and a wake without a weight load (a retried
            # generate, DAPO's next round) would sample from uninitialised memory.
            enable_weights_cpu_backup=cfg.enable_memory_saver and cfg.weights_cpu_backup,
            **cfg.engine_kwargs,
        )

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        if self._weights_lost:
            raise RuntimeError("sglang engine: generate after a sleep that discarded the weights "
                               "(rollout.engine.weights_cpu_backup: false) and before a weight load")
        params = {
            "n": 1,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_new_tokens": sampling.max_new_tokens,
            "ignore_eos": not sampling.stop_at_eos,
        }
        outputs = self.engine.generate(
            input_ids=[list(r.ids) for r in requests], sampling_params=params, return_logprob=True
        )
        if isinstance(outputs, dict):  # SGLang returns a bare dict for a batch of one
            outputs = [outputs]
        samples = [_sample(out, i) for i, out in enumerate(outputs)]
        return batch_from_samples(requests, samples, int(self.tokenizer.pad_token_id))

    def update_weights(self, buckets: list[WeightBucket]) -> int:
        """Load each bucket with ``update_weights_from_tensor`` inside one weight-update session; returns the bytes
        sent."""
        return self._loaded(self._session(lambda: self._send(buckets)))

    @property
    def sync_workers(self) -> int:
        """How many NCCL ranks this engine takes in a device-to-device sync group (its tensor- and pipeline-parallel
        schedulers)."""
        return self.config.sync_workers

    def open_device_sync(self, init_info: dict[str, Any], manifest: Sequence[TensorSpec]) -> None:
        """Join learner rank 0's weight-update group (``init_info``: `NcclSyncInit.worker_info` of the sglang wire;
        blocks until every rank joined) and cut the announced ``manifest`` into the learner's buckets."""
        info = dict(init_info)
        buffer_bytes = int(info.pop("buffer_bytes"))
        _check(self.engine.init_weights_update_group(**info), "init_weights_update_group")
        self._group = str(info["group_name"])
        self._buckets = [manifest[r.start:r.stop] for r in plan_buckets(manifest, buffer_bytes)]

    def receive_weights(self) -> int:
        """One NCCL round while learner rank 0 broadcasts: per bucket, ``update_weights_from_distributed`` receives
        the flat bucket and loads it (the radix cache is flushed after the last). Returns the bytes received."""
        if not self._buckets:
            raise RuntimeError("sglang engine: receive_weights before open_device_sync (a rollout worker restarted by "
                               "Ray is not in the learner's NCCL group)")
        return self._loaded(self._session(self._receive))

    def _loaded(self, nbytes: int) -> int:
        self._weights_lost = False
        return nbytes

    def _receive(self) -> int:
        last = len(self._buckets) - 1
        for k, specs in enumerate(self._buckets):
            result = self.engine.update_weights_from_distributed(
                names=[s.name for s in specs], dtypes=[s.dtype for s in specs], shapes=[list(s.shape) for s in specs],
                group_name=self._group, flush_cache=k == last, load_format="flattened_bucket")
            _check(result, f"update_weights_from_distributed (bucket {k} of {last + 1})")
        return sum(s.nbytes for specs in self._buckets for s in specs)

    def _session(self, load: Callable[[], int]) -> int:
        """``load`` inside one weight-update session (SGLang 0.5.23 refuses a load outside one); the session is
        closed even when a bucket fails, so the engine can take the next sync."""
        _check(self.engine.begin_weight_update(), "begin_weight_update")
        try:
            return load()
        finally:
            _check(self.engine.end_weight_update(), "end_weight_update")

    def _send(self, buckets: list[WeightBucket]) -> int:
        loaded, target = 0, getattr(torch, self.dtype)
        for k, bucket in enumerate(buckets):
            named = list(unpack_bucket(bucket).items())
            # In the engine's dtype (cast on the GPU when staged there): a float32 learner would otherwise hand
            # SGLang a float32 model.
            if self.config.stage_on_gpu:
                named = [(name, t.to("cuda").to(wire_dtype(t, target))) for name, t in named]
            else:
                # Bucket views may be read-only object-store memory, which torch cannot move into
                # shared memory in place; a private copy can.
                named = [(name, t.to(wire_dtype(t, target), copy=True)) for name, t in named]
            result = self.engine.update_weights_from_tensor(
                named_tensors=named, load_format=None, flush_cache=k == len(buckets) - 1
            )
            _check(result, f"update_weights_from_tensor (bucket {k})")
            loaded += tensor_bytes(t for _, t in named)
        return loaded

    def sleep(self, level: int = 1) -> None:
        """Release GPU memory (weights and KV cache); `level` is accepted for interface parity."""
        if not self.config.enable_memory_saver:
            raise RuntimeError("sglang engine: sleep() needs rollout.engine.enable_memory_saver: true")
        _check(self.engine.release_memory_occupation(), "release_memory_occupation")
        self._weights_lost = not self.config.weights_cpu_backup

    def wake(self) -> None:
        """Take the GPU memory back after `sleep`."""
        _check(self.engine.resume_memory_occupation(), "resume_memory_occupation")

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError(
            "sglang engine: weights live in SGLang's scheduler processes; compare generations, "
            "or use the hf engine for weight-level tests"
        )


def _sample(out: dict[str, Any], row: int) -> Sample:
    """One SGLang output dict -> `Sample`, from ``meta_info.output_token_logprobs`` (logprob, id, text)."""
    meta = out["meta_info"]
    triples = meta.get("output_token_logprobs")
    if triples is None:
        raise RuntimeError(f"sglang engine: row {row} came back without output_token_logprobs")
    ids = [int(t[1]) for t in triples]
    logprobs = [float(t[0]) for t in triples]
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind == "abort":
        raise RuntimeError(f"sglang engine: row {row} was aborted: {reason.get('message', reason)}")
    return Sample(ids, logprobs, finish_code(kind, f"sglang engine row {row}"))


def _check(result: Any, what: str) -> None:
    """Raise if an SGLang control call reports failure (a (success, message) tuple or an object with .success)."""
    if result is None:
        return
    if isinstance(result, tuple) and result and isinstance(result[0], bool):
        ok, message = result[0], result[1] if len(result) > 1 else ""
    elif isinstance(result, dict):
        ok, message = bool(result.get("success", True)), result.get("message", "")
    else:
        ok, message = bool(getattr(result, "success", True)), getattr(result, "message", "")
    if not ok:
        raise RuntimeError(f"sglang engine: {what} failed: {message}")

