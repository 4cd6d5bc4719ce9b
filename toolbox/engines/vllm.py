"""The vLLM engine: ``vllm.LLM`` offline generation, weights synced through vLLM's native weight transfer.

Two backends, fixed when the engine starts (``weight_transfer``, chosen by
`toolbox.engines.placement.choose_sync_path`): ``nccl`` when learner and engine have GPUs of their own -- learner
rank 0 broadcasts from its GPU straight into vLLM's workers (`toolbox.engines.nccl_sync`; here:
`VLLMEngine.open_device_sync` joins the group, `VLLMEngine.receive_weights` runs one round) -- and ``ipc``
otherwise, described next.

The ``ipc`` backend (``init_weight_transfer_engine`` / ``start_weight_update`` /
``update_weights`` / ``finish_weight_update``, vllm 0.33 ``vllm/distributed/weight_transfer/ipc_engine.py``):
each bucket is copied onto the GPU(s) this process shares with vLLM and handed over as CUDA IPC handles, one
``{gpu uuid: rebuild_cuda_tensor args}`` dict per tensor -- the ``args`` half of ``reduce_tensor``, which the
receiver indexes (it overwrites args[6], the device). Buckets go one at a time, cast to the engine's dtype: a
bucket's GPU copies are dropped once its ``update_weights`` has returned (a block a worker's layer-wise reload still
maps waits in torch's CUDA IPC limbo until the worker lets go), so the sync costs one bucket of GPU memory.

Sleep and wake (colocation): ``sleep`` is vLLM's level 1 (weights to host memory, KV cache dropped); the wake
before a weight load is two-stage (``LLM.wake_up(tags)``, tags "weights" / "kv_cache"): `wake_weights` (``wake_up(tags=["weights"])``),
the load, then `wake` takes the rest (``wake_up(tags=["kv_cache"])``), so the load never has the KV cache
allocated beside it.

With ``tensor_parallel_size > 1`` the engine uses vLLM's ``mp`` executor: inside a Ray actor vLLM would
otherwise pick its Ray executor, which refuses the single multi-GPU bundle the actor already holds.

Not covered without a GPU: CI's unit tests use a fake ``vllm`` module; where vllm is installed
(``scripts/engine_contracts.sh``) the IPC payload goes through vLLM's real worker-side receiver, and the NCCL
round through vLLM's real producer, receiver and worker, with CUDA (and the NCCL communicator) mocked; the real
transfers run in ``tests/gpu`` on a GPU machine (NCCL: two GPUs).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any, Literal

import torch

from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.engines.common import (
    Sample,
    batch_from_samples,
    call_rng,
    finish_code,
    request_seeds,
    tensor_bytes,
)
from toolbox.engines.nccl_sync import update_info
from toolbox.engines.vllm_config import VLLMEngineConfig
from toolbox.engines.vllm_ipc import ipc_update_info, share_on_gpus
from toolbox.learner.lora import LoraConfig, adapter_update, write_adapter_dir
from toolbox.models.loading import load_tokenizer
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.rl.weights import TensorSpec, WeightBucket, unpack_bucket

log = logging.getLogger(__name__)
WeightTransfer = Literal["ipc", "nccl"]
SLEEP_TAGS = ("weights", "kv_cache")  # what vLLM's level-1 sleep frees, in the order a weight load wakes them


@ENGINES.register("vllm", config=VLLMEngineConfig)
class VLLMEngine:
    """Samples with ``vllm.LLM``; behaviour log-probs are vLLM's log-prob of each sampled token."""

    def __init__(self, model_path: str, dtype: str = "float32", config: VLLMEngineConfig | None = None,
                 seed: int = 0, trust_remote_code: bool = False, weight_transfer: WeightTransfer = "ipc") -> None:
        """``weight_transfer``: vLLM's weight-transfer backend (``ipc``: CPU buckets in, CUDA IPC into the workers;
        ``nccl``: learner rank 0 broadcasts, after `open_device_sync`)."""
        self.config = config or VLLMEngineConfig()
        self.weight_transfer = weight_transfer
        self.dtype = dtype
        self._update_info: dict[str, Any] | None = None  # nccl: the announced names/dtypes/shapes
        self._sync_bytes = 0
        self._asleep: set[str] = set()  # the SLEEP_TAGS not woken yet
        self.tokenizer = load_tokenizer(model_path, trust_remote_code)
        torch.manual_seed(seed)  # request seeds come from this process's torch stream, which checkpoints save
        # vLLM passes the CUDA IPC handles (which hold a rebuild function) to its workers by
        # pickling; it refuses to without this flag (see vLLM's examples/rl/rlhf_ipc.py).
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        import vllm  # lazy: the module must import where vLLM is not installed

        self._vllm = vllm
        self._lora: Any = None  # learner.lora.sync: adapter: the LoRARequest of the latest adapter
        self._lora_root = ""
        cfg = self.config
        extra = dict(cfg.engine_kwargs)
        if cfg.sync_workers > 1:
            # One actor holds one bundle with all the engine's GPUs; vLLM's Ray executor would want a bundle per GPU.
            extra.setdefault("distributed_executor_backend", "mp")
        self.llm = vllm.LLM(
            model=model_path,
            dtype=dtype,
            seed=seed,
            trust_remote_code=trust_remote_code,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.enforce_eager,
            enable_sleep_mode=cfg.enable_sleep_mode,
            logprobs_mode=cfg.logprobs_mode,
            weight_transfer_config={"backend": weight_transfer},
            **extra,
        )
        if weight_transfer == "nccl":
            log.info("vllm engine: weight sync path: NCCL broadcast from learner rank 0 into vLLM's %d worker(s), "
                     "once the group is opened", cfg.tensor_parallel_size)
            return
        # The IPC backend needs no rendezvous; init tells the workers the wire format (one handle per tensor).
        self.llm.init_weight_transfer_engine({"init_info": {"packed": False}})
        log.info("vllm engine: weight sync path: learner buckets via the object store, then CUDA IPC into vLLM's "
                 "workers (%d GPU(s) visible here)", torch.cuda.device_count())

    @property
    def sync_workers(self) -> int:
        """How many NCCL ranks this engine takes in a device-to-device sync group (every tensor- and pipeline-parallel
        worker receives its part of the weights)."""
        return self.config.sync_workers

    def open_device_sync(self, init_info: dict[str, Any], manifest: Sequence[TensorSpec]) -> None:
        """Join the NCCL group of `toolbox.engines.nccl_sync` (``init_info``: `NcclSyncInit.worker_info`; blocks
        until learner rank 0 and every other engine worker joined) and keep the announced ``manifest`` for every
        later `receive_weights`."""
        if self.weight_transfer != "nccl":
            raise RuntimeError(f"vllm engine: open_device_sync needs an engine started with weight_transfer='nccl'; "
                               f"this one uses {self.weight_transfer!r}")
        self.llm.init_weight_transfer_engine({"init_info": dict(init_info)})
        self._update_info = update_info(manifest)
        self._sync_bytes = sum(s.nbytes for s in manifest)

    def receive_weights(self) -> int:
        """One NCCL round (start, receive and load every chunk, finish) while learner rank 0 sends; returns the
        bytes received."""
        if self._update_info is None:
            raise RuntimeError("vllm engine: receive_weights before open_device_sync (a rollout worker restarted by "
                               "Ray is not in the learner's NCCL group)")
        self.llm.start_weight_update()
        self.llm.update_weights({"update_info": self._update_info})
        self.llm.finish_weight_update()
        self.llm.reset_prefix_cache()  # cached prefixes hold KV computed by the old weights
        return self._sync_bytes

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        seeds = request_seeds(call_rng(), len(requests), self.config.seeded)
        params = [
            self._vllm.SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_new_tokens,
                ignore_eos=not sampling.stop_at_eos,
                logprobs=0,  # 0 alternatives: just the sampled token's log-prob
                seed=s,
            )
            for s in seeds
        ]
        prompts = [self._vllm.TokensPrompt(prompt_token_ids=list(r.ids)) for r in requests]
        lora = {"lora_request": self._lora} if self._lora is not None else {}
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False, **lora)
        samples = [_sample(out, i) for i, out in enumerate(outputs)]
        return batch_from_samples(requests, samples, int(self.tokenizer.pad_token_id))

    def update_weights(self, buckets: list[WeightBucket]) -> int:
        """Send each bucket through vLLM's IPC weight transfer (start, one update per bucket, finish), or load the
        adapter (``learner.lora.sync: adapter``); returns the bytes sent."""
        lora = adapter_update(buckets)
        if lora is not None:  # learner.lora.sync: adapter
            return self._load_adapter(buckets, lora)
        if self.weight_transfer != "ipc":
            raise RuntimeError("vllm engine: started for the nccl weight sync, it takes weights from learner rank 0 "
                               "(receive_weights), not CPU buckets")
        if not torch.cuda.is_available():
            raise RuntimeError("vllm engine: weight sync over CUDA IPC needs a GPU visible to the rollout worker")
        llm, loaded = self.llm, 0
        llm.start_weight_update()
        for bucket in buckets:
            # In the engine's dtype: a float32 learner would otherwise put a float32 model on every engine GPU.
            keep, copies, handles = share_on_gpus(unpack_bucket(bucket), getattr(torch, self.dtype))
            llm.update_weights({"update_info": ipc_update_info(copies, handles)})
            loaded += tensor_bytes(copies.values())
            # One bucket on the GPU at a time. A worker's layer-wise reload may still hold a tensor of this bucket
            # (a layer whose rest comes in the next one): torch's CUDA IPC keeps a block whose receiver still maps
            # it in limbo until the receiver lets go, and ipc_collect frees it after.
            del keep, copies, handles
            torch.cuda.ipc_collect()
        llm.finish_weight_update()
        torch.cuda.ipc_collect()  # the blocks the workers released at finish
        # Cached prefixes hold KV computed by the old weights.
        llm.reset_prefix_cache()
        return loaded

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory (level 1 offloads weights to CPU, level 2 drops them; sync weights after)."""
        if not self.config.enable_sleep_mode:
            raise RuntimeError("vllm engine: sleep() needs rollout.engine.enable_sleep_mode: true")
        self.llm.sleep(level=level)
        self._asleep = set(SLEEP_TAGS)

    def wake_weights(self) -> None:
        """The first stage of a wake before a weight load: the weights' memory only (the KV cache stays free until
        `wake`)."""
        self._wake(("weights",))

    def wake(self) -> None:
        """Take back whatever `sleep` freed and is not awake yet (all of it, or the KV cache after `wake_weights`)."""
        self._wake(SLEEP_TAGS)

    def _wake(self, tags: Sequence[str]) -> None:
        todo = [t for t in SLEEP_TAGS if t in tags and t in self._asleep]
        if not todo:
            return
        if len(todo) == len(SLEEP_TAGS):
            self.llm.wake_up()  # everything at once: vLLM's plain wake
        else:
            self.llm.wake_up(tags=todo)
        self._asleep -= set(todo)

    def _load_adapter(self, buckets: list[WeightBucket], lora: LoraConfig) -> int:
        """The adapter as a peft directory and a LoRA request with a new id (vLLM caches adapters by id, so a new
        one is loaded, not the cached previous version), used by every later `generate`; the previous adapter
        is removed from the engine and its directory deleted. Returns the adapter's bytes."""
        from vllm.lora.request import LoRARequest

        previous = self._lora
        version = 1 if previous is None else previous.lora_int_id + 1
        self._lora_root = self._lora_root or tempfile.mkdtemp(prefix="toolbox-lora-")
        path = write_adapter_dir(buckets, lora, os.path.join(self._lora_root, f"v{version}"))
        self._lora = LoRARequest(lora_name=f"policy-v{version}", lora_int_id=version, lora_path=str(path))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        self.llm.reset_prefix_cache()  # cached prefixes hold KV computed with the previous adapter
        return sum(b.nbytes for b in buckets)

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError(
            "vllm engine: weights live in vLLM's worker processes in fused/sharded layouts; "
            "compare generations, or use the hf engine for weight-level tests"
        )


def _sample(out: Any, row: int) -> Sample:
    """A vLLM ``RequestOutput`` -> `Sample`; the log-prob is the sampled token's entry."""
    completion = out.outputs[0]
    ids = [int(t) for t in completion.token_ids]
    if completion.logprobs is None or len(completion.logprobs) != len(ids):
        raise RuntimeError(f"vllm engine: row {row} came back without one log-prob per token")
    logprobs = [float(completion.logprobs[k][tok].logprob) for k, tok in enumerate(ids)]
    return Sample(ids, logprobs, finish_code(completion.finish_reason, f"vllm engine row {row}"))


