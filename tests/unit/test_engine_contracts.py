"""Contracts of the vllm / sglang / http engines without a GPU.

Fake ``vllm`` / ``sglang`` modules shaped like the real outputs exercise the conversion to a
`RolloutBatch` and the weight-sync call order (CI runs these). Where the real package is installed
(``scripts/engine_contracts.sh`` builds throwaway venvs with the released wheels), the adapter's actual
weight-sync payload goes through the package's own receiver -- vLLM's worker and
``IPCWeightTransferEngine``, SGLang's ``Engine`` / ``TokenizerManager`` / scheduler weight updater -- with
CUDA replaced by `FakeIPC`; the NCCL sync's rounds go through vLLM's real producer and consumer (communicator
faked) and into SGLang's real distributed receiver (a real gloo group with the learner's sender in another process). The http engine talks to a real stdlib OpenAI-style server with the real
``openai`` client. Not covered here: real generation and real CUDA IPC (tests/gpu).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import random
import sys
import threading
import types
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from toolbox.engines import http as http_mod
from toolbox.engines import sglang as sglang_mod
from toolbox.engines import vllm as vllm_mod
from toolbox.engines import vllm_ipc
from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.engines.common import request_seeds, tensor_bytes, wire_dtype
from toolbox.engines.nccl_sync import SGLANG_GROUP, NcclWeightSender, plan_group, weight_manifest
from toolbox.models.tiny import build_char_tokenizer
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, PromptRequest
from toolbox.rl.weights import TensorSpec, pack_state_dict

PAD, EOS, A, B, C = 0, 2, 3, 4, 5  # char tokenizer over "abc": <pad> <s> </s> a b c
REQUESTS = [PromptRequest([A, B], 0, {"answer": "x"}), PromptRequest([A, B, C], 0), PromptRequest([C], 1)]
SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=4, stop_at_eos=True)


def scripted(prompt: list[int], max_tokens: int) -> tuple[list[int], list[float], str]:
    """Even-length prompts stop on EOS after "ab"; odd ones run to max_tokens of "c"."""
    ids = [A, B, EOS] if len(prompt) % 2 == 0 else [C] * max_tokens
    return ids, [-0.5 * (k + 1) for k in range(len(ids))], "stop" if len(prompt) % 2 == 0 else "length"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tok")
    build_char_tokenizer("abc").save_pretrained(path)
    return str(path)


def check_batch(batch) -> None:  # noqa: ANN001
    assert batch.prompt_ids_BP.tolist() == [[PAD, A, B], [A, B, C], [PAD, PAD, C]]
    assert batch.prompt_mask_BP.tolist() == [[0, 1, 1], [1, 1, 1], [0, 0, 1]]
    assert batch.response_ids_BR.tolist() == [[A, B, EOS, PAD], [C] * 4, [C] * 4]
    assert batch.response_mask_BR.tolist() == [[1, 1, 1, 0], [1] * 4, [1] * 4]
    assert torch.allclose(batch.logprobs_BR[0], torch.tensor([-0.5, -1.0, -1.5, 0.0]))
    assert batch.finish_B.tolist() == [FINISH_STOP, FINISH_LENGTH, FINISH_LENGTH]
    assert batch.group_B.tolist() == [0, 0, 1] and batch.extras[0] == {"answer": "x"}


def test_engines_register() -> None:
    assert ENGINES.get("vllm").factory is vllm_mod.VLLMEngine
    assert ENGINES.get("sglang").factory is sglang_mod.SGLangEngine
    assert ENGINES.get("http").factory is http_mod.HTTPEngine
    for name in ("vllm", "sglang", "http"):
        ENGINES.validate({"name": name}, "rollout.engine")  # defaults are a valid config


def test_request_seeds_are_distinct_reproducible_or_off() -> None:
    seeds = request_seeds(random.Random(5), 64)
    assert len(set(seeds)) == 64 and seeds == request_seeds(random.Random(5), 64)
    assert request_seeds(random.Random(5), 3, seeded=False) == [None, None, None]


def test_tensor_bytes_counts_element_sizes() -> None:
    assert tensor_bytes([torch.zeros(3, dtype=torch.float32), torch.zeros(2, 2, dtype=torch.bfloat16)]) == 12 + 8


def test_vllm_api_we_call_exists() -> None:
    vllm = pytest.importorskip("vllm")
    vllm.SamplingParams(n=1, temperature=1.0, top_p=1.0, max_tokens=4, ignore_eos=False, logprobs=0, seed=1)
    vllm.TokensPrompt(prompt_token_ids=[1, 2])
    inspect.signature(vllm.LLM.generate).bind(object(), [], sampling_params=[], use_tqdm=False)
    names = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    assert {"logprobs_mode", "weight_transfer_config", "enable_sleep_mode", "seed"} <= names
    for method in ("init_weight_transfer_engine", "update_weights", "reset_prefix_cache", "sleep", "wake_up"):
        assert callable(getattr(vllm.LLM, method, None)), method
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo

    assert {"names", "dtype_names", "shapes", "ipc_handles"} <= {f.name for f in dataclasses.fields(IPCWeightTransferUpdateInfo)}


def test_sglang_api_we_call_exists() -> None:
    sglang = pytest.importorskip("sglang")
    from sglang.srt.server_args import ServerArgs

    inspect.signature(sglang.Engine.generate).bind(object(), input_ids=[[1]], sampling_params={}, return_logprob=True)
    inspect.signature(sglang.Engine.update_weights_from_tensor).bind(
        object(), named_tensors=[], load_format=None, flush_cache=True
    )
    assert callable(sglang.Engine.release_memory_occupation) and callable(sglang.Engine.resume_memory_occupation)
    assert callable(sglang.Engine.begin_weight_update) and callable(sglang.Engine.end_weight_update)
    inspect.signature(sglang.Engine.init_weights_update_group).bind(
        object(), master_address="h", master_port=1, rank_offset=1, world_size=2, group_name="g", backend="nccl")
    inspect.signature(sglang.Engine.update_weights_from_distributed).bind(
        object(), names=[], dtypes=[], shapes=[], group_name="g", flush_cache=True, load_format="flattened_bucket")
    # ServerArgs is a msgspec Struct in 0.5.23 (a dataclass before): read its field names either way.
    names = set(getattr(ServerArgs, "__struct_fields__", ())) or {f.name for f in dataclasses.fields(ServerArgs)}
    assert {"model_path", "dtype", "random_seed", "tp_size", "mem_fraction_static", "enable_memory_saver"} <= names



class FakeLLM:
    def __init__(self, **kwargs: object) -> None:
        self.kwargs, self.reason = kwargs, None  # reason: overrides every finish reason when set
        self.calls: list[tuple] = []

    def generate(self, prompts: list[dict], sampling_params: list, *, use_tqdm: bool = True) -> list:
        self.calls.append(("generate", sampling_params))
        outs = []
        for prompt, sp in zip(prompts, sampling_params):
            ids, lps, reason = scripted(prompt["prompt_token_ids"], sp.max_tokens)
            # Each position also lists a decoy: the engine must pick the sampled token's entry.
            logprobs = [{t: types.SimpleNamespace(logprob=lp), 99: types.SimpleNamespace(logprob=0.0)}
                        for t, lp in zip(ids, lps)]
            completion = types.SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=self.reason or reason)
            outs.append(types.SimpleNamespace(outputs=[completion]))
        return outs

    def __getattr__(self, method: str):  # noqa: ANN204 - records every other call
        return lambda *args, **kwargs: self.calls.append((method, args, kwargs))


class FakeSamplingParams:
    def __init__(self, *, n: int, temperature: float, top_p: float, max_tokens: int,
                 ignore_eos: bool, logprobs: int, seed: int | None) -> None:
        self.n, self.max_tokens, self.ignore_eos, self.logprobs, self.seed = n, max_tokens, ignore_eos, logprobs, seed


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    fake = types.SimpleNamespace(LLM=FakeLLM, SamplingParams=FakeSamplingParams, TokensPrompt=dict)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION")  # restored to its original state afterwards
    return fake


def test_vllm_generate_builds_batch(fake_vllm: types.SimpleNamespace, tok_dir: str) -> None:
    engine = vllm_mod.VLLMEngine(tok_dir, seed=3)
    llm = engine.llm
    assert llm.kwargs["weight_transfer_config"] == {"backend": "ipc"}
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.calls[0][0] == "init_weight_transfer_engine"
    check_batch(engine.generate(REQUESTS, SAMPLING))
    params = llm.calls[-1][1]
    assert len({p.seed for p in params}) == 3 and all(p.logprobs == 0 and not p.ignore_eos for p in params)
    llm.reason = "abort"
    with pytest.raises(RuntimeError, match="abort"):
        engine.generate(REQUESTS, SAMPLING)


class FakeIPC:
    """CUDA IPC without CUDA: ``reduce_tensor`` hands out rebuild args that name a slot here, the receiver's
    ``rebuild_cuda_tensor`` resolves the slot -- and fails if the producer's copy is already freed."""

    UUID = "GPU-fake-0"

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from torch.multiprocessing import reductions

        self.copies: list[weakref.ref] = []
        for name, fn in (("is_available", lambda: True), ("device_count", lambda: 1), ("synchronize", lambda *a: None),
                         ("ipc_collect", lambda: None),
                         ("get_device_properties", lambda d: types.SimpleNamespace(uuid=self.UUID))):
            monkeypatch.setattr(torch.cuda, name, fn)
        monkeypatch.setattr(vllm_ipc, "_gpu_copy", lambda t, d, dtype: t.to(wire_dtype(t, dtype), copy=True))
        monkeypatch.setattr(reductions, "reduce_tensor", self.reduce)

    def reduce(self, t: torch.Tensor) -> tuple:
        self.copies.append(weakref.ref(t))
        # rebuild_cuda_tensor's 15 args; [6] is the device the receiver overwrites, [7] the storage's IPC handle.
        args = (type(t), t.shape, t.stride(), 0, None, t.dtype, 0, len(self.copies) - 1,
                t.numel() * t.element_size(), 0, False, None, 0, None, False)
        return self.rebuild, args

    def rebuild(self, *args: object) -> torch.Tensor:
        if len(args) != 15:
            raise TypeError(f"rebuild_cuda_tensor takes the 15 args of reduce_tensor, got {len(args)}: {args!r:.80}")
        copy = self.copies[args[7]]()  # type: ignore[index]
        if copy is None:
            raise RuntimeError("the producer freed a shared GPU copy before the receiver was finished with it")
        return copy

    def all_alive(self) -> bool:
        return all(ref() is not None for ref in self.copies)


def test_vllm_update_weights_uses_ipc_protocol(fake_vllm: types.SimpleNamespace, tok_dir: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    engine = vllm_mod.VLLMEngine(tok_dir, dtype="bfloat16")
    assert engine.llm.calls[0][1][0] == {"init_info": {"packed": False}}
    ipc = FakeIPC(monkeypatch)
    alive_at_finish = []
    engine.llm.finish_weight_update = lambda: alive_at_finish.append(ipc.all_alive())
    state = {"w": torch.arange(16.0).view(4, 4), "b": torch.ones(4, dtype=torch.bfloat16)}
    loaded = engine.update_weights(pack_state_dict(state, bucket_bytes=64))
    assert loaded == 4 * 4 * 2 + 4 * 2  # in the engine's dtype
    methods = [c[0] for c in engine.llm.calls[1:]]
    assert methods == ["start_weight_update", "update_weights", "update_weights", "reset_prefix_cache"]
    assert alive_at_finish == [False]  # each bucket's GPU copies are released once its update returned
    infos = [c[1][0]["update_info"] for c in engine.llm.calls if c[0] == "update_weights"]
    assert [i["names"] for i in infos] == [["w"], ["b"]]
    assert infos[1]["dtype_names"] == ["bfloat16"] and infos[0]["shapes"] == [[4, 4]]
    handle = infos[0]["ipc_handles"][0]
    assert list(handle) == [FakeIPC.UUID] and isinstance(handle[FakeIPC.UUID], tuple)
    with pytest.raises(RuntimeError, match="enable_sleep_mode"):
        engine.sleep()


def test_vllm_tensor_parallel_uses_mp_executor(fake_vllm: types.SimpleNamespace, tok_dir: str) -> None:
    engine = vllm_mod.VLLMEngine(tok_dir, config=vllm_mod.VLLMEngineConfig(tensor_parallel_size=2))
    assert engine.llm.kwargs["distributed_executor_backend"] == "mp"
    assert "distributed_executor_backend" not in vllm_mod.VLLMEngine(tok_dir).llm.kwargs
    assert "distributed_executor_backend" not in engine.config.engine_kwargs  # the config is not mutated


def test_tensor_parallel_engine_needs_as_many_gpus() -> None:
    from toolbox.config.schema import ExperimentConfig
    from toolbox.core.errors import ConfigError

    for engine, field in (({"name": "vllm", "tensor_parallel_size": 2}, "tensor_parallel_size"),
                          ({"name": "sglang", "tp_size": 2}, "tp_size")):
        with pytest.raises((ConfigError, ValueError), match=rf"rollout.engine.{field} is 2 but rollout.gpus_per_worker is 1"):
            ExperimentConfig.model_validate({"rollout": {"engine": engine, "gpus_per_worker": 1}})
        ExperimentConfig.model_validate({"rollout": {"engine": engine, "gpus_per_worker": 2}})
    ExperimentConfig.model_validate({"rollout": {"engine": {"name": "vllm"}, "gpus_per_worker": 0.5}})  # sharing


class RecordingModel(torch.nn.Module):
    """The receiving model: records each ``load_weights`` call (names, and copies of the values)."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log, self.loaded = log, {}

    def load_weights(self, weights) -> set[str]:  # noqa: ANN001 - an iterable of (name, tensor)
        names = []
        for name, t in weights:
            self.loaded[name] = t.detach().clone()
            names.append(name)
        self.log.append(("load", names))
        return set(names)


def test_vllm_payload_through_real_ipc_receiver(tok_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = pytest.importorskip("vllm")
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer import ipc_engine
    from vllm.model_executor.model_loader import reload
    from vllm.v1.worker.gpu_worker import Worker

    log: list = []
    ipc = FakeIPC(monkeypatch)
    monkeypatch.setattr(ipc_engine, "rebuild_cuda_tensor", ipc.rebuild)
    monkeypatch.setattr(reload, "initialize_layerwise_reload", lambda model: log.append("start"))
    monkeypatch.setattr(reload, "finalize_layerwise_reload", lambda model, cfg: log.append(("finish", ipc.all_alive())))
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: None)
    model = RecordingModel(log)
    config = types.SimpleNamespace(parallel_config=None, model_config=None)
    # vLLM's worker object without its GPU setup: its real weight-update methods drive the real IPC receiver.
    worker = Worker.__new__(Worker)
    worker.__dict__.update(weight_transfer_engine=ipc_engine.IPCWeightTransferEngine(
        WeightTransferConfig(backend="ipc"), config, torch.device("cuda", 0), model), vllm_config=config, rank=0,
        _weight_update_active=False, _weight_update_is_draft=False,
        model_runner=types.SimpleNamespace(reset_lora_state=lambda: None))

    def rpc(method: str, kwargs: dict | None = None) -> None:
        getattr(Worker, method)(worker, **(kwargs or {}))

    class WiredLLM(vllm.LLM):  # the real LLM's weight-transfer methods, over one in-process worker
        def __init__(self, **kwargs: object) -> None:
            self.kwargs = kwargs
            self.llm_engine = types.SimpleNamespace(collective_rpc=rpc,
                                                    reset_prefix_cache=lambda *a: log.append("reset_prefix_cache"))

    monkeypatch.setattr(vllm, "LLM", WiredLLM)
    engine = vllm_mod.VLLMEngine(tok_dir, dtype="bfloat16")
    assert worker.weight_transfer_engine.packed is False  # init_info parsed by IPCWeightTransferInitInfo
    state = {"w": torch.arange(16.0).view(4, 4), "b": torch.ones(4, dtype=torch.bfloat16)}
    engine.update_weights(pack_state_dict(state, bucket_bytes=64))
    assert log == ["start", ("load", ["w"]), ("load", ["b"]), ("finish", False), "reset_prefix_cache"]
    assert all(torch.equal(model.loaded[k], v.to(torch.bfloat16)) for k, v in state.items())  # the engine's dtype



class FakeEngine:
    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs
        self.updates: list[tuple] = []

    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False):  # noqa: ANN001, ANN201
        outs = []
        for ids_in in input_ids:
            ids, lps, reason = scripted(ids_in, sampling_params["max_new_tokens"])
            finish = {"type": reason, "matched": EOS} if reason == "stop" else {"type": reason, "length": len(ids)}
            meta = {"finish_reason": finish, "output_token_logprobs": [(lp, t, None) for t, lp in zip(ids, lps)]}
            outs.append({"text": "", "meta_info": meta})
        return outs[0] if len(outs) == 1 else outs

    def begin_weight_update(self) -> tuple[bool, str]:
        self.updates.append("begin")
        return True, "Success"

    def end_weight_update(self) -> tuple[bool, str]:
        self.updates.append("end")
        return True, "Success"

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):  # noqa: ANN001, ANN201
        if self.updates[-1:] == ["end"] or not self.updates:  # SGLang 0.5.23 refuses updates outside a session
            return False, "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()"
        self.updates.append((named_tensors, flush_cache))
        return True, "Success"

    def init_weights_update_group(self, **kwargs: object) -> tuple[bool, str]:
        self.updates.append(("init_weights_update_group", kwargs))
        return True, "Succeeded to initialize custom process group."

    def update_weights_from_distributed(self, **kwargs: object) -> tuple[bool, str]:
        if self.updates[-1:] == ["end"] or "begin" not in self.updates:
            return False, "update_weights_from_distributed must run between begin_weight_update() and ..."
        self.updates.append(("distributed", kwargs))
        return (False, "Failed to receive weights: boom") if kwargs["names"] == ["fail"] else (True, "Success")


def test_sglang_generate_and_update(monkeypatch: pytest.MonkeyPatch, tok_dir: str) -> None:
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=FakeEngine))
    cfg = sglang_mod.SGLangEngineConfig(stage_on_gpu=False)
    engine = sglang_mod.SGLangEngine(tok_dir, dtype="bfloat16", config=cfg, seed=7)
    assert engine.engine.kwargs["random_seed"] == 7 and engine.engine.kwargs["dtype"] == "bfloat16"
    check_batch(engine.generate(REQUESTS, SAMPLING))
    one = engine.generate(REQUESTS[:1], SAMPLING)  # SGLang answers a batch of one with a bare dict
    assert one.response_ids_BR.tolist() == [[A, B, EOS]]
    state = {"w": torch.arange(16.0).view(4, 4), "b": torch.ones(4)}
    assert engine.update_weights(pack_state_dict(state, bucket_bytes=64)) == 16 * 2 + 4 * 2  # the engine's bf16
    updates = engine.engine.updates
    assert updates[0] == "begin" and updates[-1] == "end" and len(updates) == 4
    assert [flush for _, flush in updates[1:-1]] == [False, True]  # flush the cache once, at the end
    assert torch.equal(dict(updates[1][0])["w"], state["w"].to(torch.bfloat16))


def test_sglang_payload_through_real_scheduler_updater(tok_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sglang = pytest.importorskip("sglang")
    from sglang.srt.entrypoints import engine as engine_module
    from sglang.srt.entrypoints.engine import Engine  # `sglang.Engine` is a lazy proxy of it
    from sglang.srt.managers import tokenizer_control_mixin, tp_worker
    from sglang.srt.managers.scheduler_components import weight_updater
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.utils.aio_rwlock import RWLock

    parallel = types.SimpleNamespace(tp_size=1, tp_rank=0, dp_size=1, tp_group=types.SimpleNamespace(cpu_group=None))
    for module in (engine_module, tokenizer_control_mixin, tp_worker, weight_updater):
        monkeypatch.setattr(module, "get_parallel", lambda: parallel)
    monkeypatch.setattr(torch.distributed, "barrier", lambda *a, **k: None)
    log: list = []
    model = RecordingModel(log)

    class RunnerUpdater:  # one model runner's loader: what SGLang's scheduler calls per runner
        def begin_weight_update(self) -> None:
            log.append("begin")

        def update_weights_from_tensor(self, named_tensors, load_format=None):  # noqa: ANN001, ANN201
            model.load_weights(named_tensors)
            return True, "Success"

        def end_weight_update(self, run_post_load: bool) -> None:
            log.append(("end", run_post_load))

    def deserialize_own_rank(payloads: list) -> list:  # noqa: ANN001
        # The real scheduler process patches torch's tensor reductions (CUDA device -> UUID) for good; here it
        # shares our process, whose pickler must stay unpatched as it is in a real deployment.
        from torch.multiprocessing import reductions

        saved = {k: getattr(reductions, k) for k in ("reduce_tensor", "rebuild_cuda_tensor")}
        try:
            return tp_worker.BaseTpWorker.deserialize_own_rank(None, payloads)
        finally:
            for k, v in saved.items():
                setattr(reductions, k, v)
            for k in ("_reduce_tensor_original", "_rebuild_cuda_tensor_original"):
                reductions.__dict__.pop(k, None)
            reductions.init_reductions()

    runner = types.SimpleNamespace(weight_updater=RunnerUpdater())
    worker = types.SimpleNamespace(weight_update_runners=lambda: [("target", runner)],
                                   deserialize_own_rank=deserialize_own_rank)
    scheduler = weight_updater.SchedulerWeightUpdaterManager(
        tp_worker=worker, draft_worker=None, memory_saver_adapter=None, is_fully_idle=lambda **k: True,
        flush_cache=lambda **k: log.append("flush") or True,
        scheduler=types.SimpleNamespace(record_weight_version_change=lambda new_version: None))

    def relay(handler):  # noqa: ANN001, ANN202 - the ZMQ hop to the scheduler, in-process
        async def communicator(obj):  # noqa: ANN001, ANN202
            return [handler(obj)]
        return communicator

    class WiredEngine(Engine):  # the real Engine -> TokenizerManager -> scheduler path, without processes
        def __init__(self, **kwargs: object) -> None:
            self.kwargs = kwargs
            self.loop = asyncio.new_event_loop()
            tm = TokenizerManager.__new__(TokenizerManager)
            tm.__dict__.update(auto_create_handle_loop=lambda: None, _is_pause=False, is_pause_cond=asyncio.Condition(),
                               model_update_lock=RWLock(), mm_processor=None,
                               begin_weight_update_communicator=relay(scheduler.begin_weight_update),
                               end_weight_update_communicator=relay(scheduler.end_weight_update),
                               update_weights_from_tensor_communicator=relay(scheduler.update_weights_from_tensor))
            self.tokenizer_manager = tm

    monkeypatch.setattr(sglang, "Engine", WiredEngine)
    engine = sglang_mod.SGLangEngine(tok_dir, config=sglang_mod.SGLangEngineConfig(stage_on_gpu=False))
    state = {"w": torch.arange(16.0).view(4, 4), "b": torch.ones(4, dtype=torch.bfloat16)}
    engine.update_weights(pack_state_dict(state, bucket_bytes=64))
    assert log == ["begin", ("load", ["w"]), ("load", ["b"]), "flush", ("end", False)]
    assert all(torch.equal(model.loaded[k], v) for k, v in state.items())
    engine.engine.loop.close()



class CompletionsHandler(BaseHTTPRequestHandler):
    mode = "ids"  # "ids": tokens spelled token_id:N; "token_ids": choices[].token_ids; "text": text only; "bad": misaligned
    bodies: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        ids, lps, reason = scripted(body["prompt"], body["max_tokens"])
        text = "".join("abc"[t - A] for t in ids if t != EOS)
        spelled = list(text) + [""] * (EOS in ids)
        tokens = {"ids": [f"token_id:{t}" for t in ids], "text": spelled, "token_ids": [text]}.get(self.mode)  # token_ids: unusable text
        if self.mode == "bad":
            tokens, lps = [text], lps[:1]
        logprobs = {"tokens": tokens, "token_logprobs": lps, "top_logprobs": None, "text_offset": None}
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
        if self.mode == "token_ids" and body.get("return_token_ids"):
            choice["token_ids"] = ids
        payload = json.dumps({"id": "cmpl-0", "object": "text_completion", "created": 0,
                              "model": body["model"], "choices": [choice]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    CompletionsHandler.bodies = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), CompletionsHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_http_generate_against_server(server: str, tok_dir: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CompletionsHandler, "mode", mode)
    cfg = http_mod.HTTPEngineConfig(base_url=server, max_retries=0, max_concurrency=2, server_token_ids=mode == "ids",
                                    token_ids_field="return_tokens_as_token_ids")  # vLLM's token_id:N spelling
    engine = http_mod.HTTPEngine(tok_dir, config=cfg)
    check_batch(engine.generate(REQUESTS, SAMPLING))
    bodies = CompletionsHandler.bodies
    assert sorted(b["prompt"] for b in bodies) == sorted(r.ids for r in REQUESTS)
    assert all(b["logprobs"] == 1 and b["n"] == 1 and b["max_tokens"] == 4 and b["model"] == tok_dir for b in bodies)
    assert len({b["seed"] for b in bodies}) == 3
    assert all(b.get("return_tokens_as_token_ids") is (True if mode == "ids" else None) for b in bodies)


def test_http_asks_for_token_ids_by_default(server: str, tok_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CompletionsHandler, "mode", "token_ids")
    engine = http_mod.HTTPEngine(tok_dir, config=http_mod.HTTPEngineConfig(base_url=server, max_retries=0))
    check_batch(engine.generate(REQUESTS, SAMPLING))
    assert all(b.get("return_token_ids") is True for b in CompletionsHandler.bodies)


def test_http_misaligned_text_is_an_error(server: str, tok_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CompletionsHandler, "mode", "bad")
    engine = http_mod.HTTPEngine(tok_dir, config=http_mod.HTTPEngineConfig(base_url=server, max_retries=0))
    with pytest.raises(RuntimeError, match="log-probs"):
        engine.generate(REQUESTS[:1], SAMPLING)


def test_http_refuses_weight_updates_unless_allowed(server: str, tok_dir: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    # This server has no GET /v1/toolbox/info (it answers 501): not toolbox.commands.serve, so it cannot take weights.
    buckets = pack_state_dict({"w": torch.ones(2)})
    with pytest.raises(NotImplementedError, match="toolbox/info answered 501") as refused:
        http_mod.HTTPEngine(tok_dir, config=http_mod.HTTPEngineConfig(base_url=server)).update_weights(buckets)
    assert "allow_stale_weights" in str(refused.value)
    stale = http_mod.HTTPEngine(tok_dir, config=http_mod.HTTPEngineConfig(base_url=server, allow_stale_weights=True))
    with caplog.at_level("WARNING"):
        assert stale.update_weights(buckets) == 0
    assert "keeps its own weights" in caplog.text


# ---- vLLM: the NCCL weight sync's engine side, and the two-stage wake ---------------------------------------------
NCCL_MANIFEST = [TensorSpec("w", "float32", (4, 4), 64), TensorSpec("b", "bfloat16", (4,), 8)]


def test_vllm_nccl_engine_side_protocol(fake_vllm: types.SimpleNamespace, tok_dir: str) -> None:
    engine = vllm_mod.VLLMEngine(tok_dir, weight_transfer="nccl")
    llm = engine.llm
    assert llm.kwargs["weight_transfer_config"] == {"backend": "nccl"} and llm.calls == []  # joins at open, not here
    with pytest.raises(RuntimeError, match="before open_device_sync"):
        engine.receive_weights()
    with pytest.raises(RuntimeError, match="not CPU buckets"):
        engine.update_weights(pack_state_dict({"w": torch.ones(2)}))
    info = plan_group("10.0.0.1", 29500, [engine.sync_workers], 1 << 20)[0].worker_info(1)
    engine.open_device_sync(info, NCCL_MANIFEST)
    assert llm.calls == [("init_weight_transfer_engine", ({"init_info": info},), {})]
    assert engine.receive_weights() == 72
    assert [c[0] for c in llm.calls[1:]] == ["start_weight_update", "update_weights", "finish_weight_update",
                                             "reset_prefix_cache"]
    assert llm.calls[2][1][0] == {"update_info": {"names": ["w", "b"], "dtype_names": ["float32", "bfloat16"],
                                                  "shapes": [[4, 4], [4]]}}
    with pytest.raises(RuntimeError, match="weight_transfer='nccl'"):
        vllm_mod.VLLMEngine(tok_dir).open_device_sync(info, NCCL_MANIFEST)


def test_vllm_two_stage_wake_around_a_weight_load(fake_vllm: types.SimpleNamespace, tok_dir: str) -> None:
    pytest.importorskip("ray")  # the rollout worker's module imports it; the engine venvs of engine_contracts.sh lack it
    from toolbox.actors.rollout import RolloutWorker

    engine = vllm_mod.VLLMEngine(tok_dir, config=vllm_mod.VLLMEngineConfig(enable_sleep_mode=True),
                                 weight_transfer="nccl")
    engine.open_device_sync({}, NCCL_MANIFEST)
    worker = RolloutWorker(0, lambda rank: engine)
    calls = engine.llm.calls
    calls.clear()
    worker.sleep()
    worker.receive_weights()  # the colocated step: asleep since its generate, the new weights arrive
    assert [(c[0], c[2]) for c in calls] == [
        ("sleep", {"level": 1}),
        ("wake_up", {"tags": ["weights"]}),  # the weights' memory first ...
        ("start_weight_update", {}), ("update_weights", {}), ("finish_weight_update", {}), ("reset_prefix_cache", {}),
        ("wake_up", {"tags": ["kv_cache"]}),  # ... the KV cache only after the load
    ]
    calls.clear()
    worker.sleep()
    worker.wake()  # a wake without a load (the next generate, DAPO's next round): vLLM's plain wake_up()
    worker.wake()
    assert [(c[0], c[2]) for c in calls] == [("sleep", {"level": 1}), ("wake_up", {})]
    assert not worker.asleep


class FakeNccl:
    """vLLM's ``PyNcclCommunicator`` without NCCL: rank 0's broadcasts go onto a shared wire, every other rank reads
    them back in order into its own buffer -- and fails if the sizes the two sides cut differ."""

    def __init__(self, wire: list, rank: int) -> None:
        self.wire, self.rank, self.read = wire, rank, 0

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream: object = None) -> None:
        if self.rank == src:
            self.wire.append(tensor.clone())
            return
        sent = self.wire[self.read]
        if (sent.dtype, sent.numel()) != (tensor.dtype, tensor.numel()):
            raise RuntimeError(f"receiver cut chunk {self.read} as {tensor.numel()} x {tensor.dtype}, "
                               f"the sender sent {sent.numel()} x {sent.dtype}")
        tensor.copy_(sent)
        self.read += 1


class FakeStream:
    def synchronize(self) -> None: ...

    def wait_event(self, event: object) -> None: ...


def test_nccl_sync_through_real_vllm_producer_and_receiver(tok_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Learner side (`NcclWeightSender`: vLLM's ``trainer_init`` and ``packed_nccl_broadcast_producer``) and engine
    side (`VLLMEngine` over vLLM's real ``Worker`` / ``NCCLWeightTransferEngine`` / packed consumer), with only
    CUDA streams and the NCCL communicator replaced: the rendezvous ranks, the packed chunks both sides cut, the
    start -> load per chunk -> finish order and the loaded values."""
    vllm = pytest.importorskip("vllm")
    import contextlib

    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer import nccl_common, nccl_engine, packed_tensor
    from vllm.model_executor.model_loader import reload
    from vllm.v1.worker.gpu_worker import Worker

    wire: list = []
    joined: list = []

    def stateless_init_process_group(address: str, port: int, rank: int, world_size: int, device: object) -> FakeNccl:
        joined.append((address, port, rank, world_size))
        return FakeNccl(wire, rank)

    monkeypatch.setattr(nccl_common, "stateless_init_process_group", stateless_init_process_group)
    monkeypatch.setattr(packed_tensor, "_get_streams", lambda device, n: tuple(FakeStream() for _ in range(n)))
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "current_stream", lambda *a: FakeStream())
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch, "Event", lambda *a, **k: types.SimpleNamespace(record=lambda *a: None))
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    log: list = []
    monkeypatch.setattr(reload, "initialize_layerwise_reload", lambda model: log.append("start"))
    monkeypatch.setattr(reload, "finalize_layerwise_reload", lambda model, cfg: log.append("finish"))

    # The engine: vLLM's worker object without its GPU setup, its real NCCL weight-transfer engine on the CPU.
    model = RecordingModel(log)
    parallel = types.SimpleNamespace(data_parallel_index=0, world_size=1, rank=0)
    config = types.SimpleNamespace(parallel_config=parallel, model_config=None)
    worker = Worker.__new__(Worker)
    worker.__dict__.update(weight_transfer_engine=nccl_engine.NCCLWeightTransferEngine(
        WeightTransferConfig(backend="nccl"), config, torch.device("cpu"), model), vllm_config=config, rank=0,
        _weight_update_active=False, _weight_update_is_draft=False,
        model_runner=types.SimpleNamespace(reset_lora_state=lambda: None))

    class WiredLLM(vllm.LLM):
        def __init__(self, **kwargs: object) -> None:
            self.kwargs = kwargs
            self.llm_engine = types.SimpleNamespace(
                collective_rpc=lambda method, kwargs=None: getattr(Worker, method)(worker, **(kwargs or {})),
                reset_prefix_cache=lambda *a: log.append("reset_prefix_cache"))

    monkeypatch.setattr(vllm, "LLM", WiredLLM)
    engine = vllm_mod.VLLMEngine(tok_dir, weight_transfer="nccl")
    assert engine.llm.kwargs["weight_transfer_config"] == {"backend": "nccl"}

    # The learner: three tensors, a 64-byte chunk size, so the stream is cut into several packed chunks.
    learner = torch.nn.Module()
    learner.register_parameter("w", torch.nn.Parameter(torch.arange(16.0).view(4, 4)))  # 64 bytes
    learner.register_parameter("b", torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16)))  # 8 bytes
    learner.register_parameter("v", torch.nn.Parameter(torch.full((3,), 2.0)))  # 12 bytes
    sender = NcclWeightSender(learner, 0, torch.device("cuda", 0))  # a device object only: nothing is allocated
    init, offsets = plan_group("127.0.0.1", 29500, [engine.sync_workers], buffer_bytes=64)
    sender.open(init)  # in a run both opens are concurrent Ray calls; here the fake group needs no rendezvous
    engine.open_device_sync(init.worker_info(offsets[0]), sender.manifest)
    assert joined == [("127.0.0.1", 29500, 0, 2), ("127.0.0.1", 29500, 1, 2)]  # learner rank 0, then the worker
    wte = worker.weight_transfer_engine
    assert (wte.packed, wte.packed_buffer_size_bytes, wte.packed_num_buffers) == (True, 64, 2)

    sender.device = torch.device("cpu")  # the walk and the broadcast run on the CPU here
    assert sender.send() == 84
    assert [t.numel() for t in wire] == [64 + 8, 12]  # chunks close once they exceed 64 bytes
    assert engine.receive_weights() == 84
    assert log == ["start", ("load", ["w", "b"]), ("load", ["v"]), "finish", "reset_prefix_cache"]
    assert all(torch.equal(model.loaded[k], v.detach()) for k, v in learner.state_dict().items())
    assert model.loaded["b"].dtype == torch.bfloat16


# ---- SGLang: the NCCL weight sync's engine side ---------------------------------------------------------------------
def test_sglang_nccl_engine_side_protocol(monkeypatch: pytest.MonkeyPatch, tok_dir: str) -> None:
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=FakeEngine))
    engine = sglang_mod.SGLangEngine(tok_dir, config=sglang_mod.SGLangEngineConfig(tp_size=2))
    assert engine.sync_workers == 2
    with pytest.raises(RuntimeError, match="before open_device_sync"):
        engine.receive_weights()
    init, offsets = plan_group("10.0.0.1", 29500, [1, engine.sync_workers], buffer_bytes=64, wire="sglang")
    manifest = [*NCCL_MANIFEST, TensorSpec("v", "float32", (4,), 16)]  # 64 | 8 + 16: two buckets
    engine.open_device_sync(init.worker_info(offsets[1]), manifest)
    calls = engine.engine.updates
    assert calls == [("init_weights_update_group", {"master_address": "10.0.0.1", "master_port": 29500,
                                                    "world_size": 4, "rank_offset": 2, "group_name": SGLANG_GROUP,
                                                    "backend": "nccl"})]
    calls.clear()
    assert engine.receive_weights() == 88
    assert calls[0] == "begin" and calls[-1] == "end" and len(calls) == 4
    assert [c[1] for c in calls[1:-1]] == [
        {"names": ["w"], "dtypes": ["float32"], "shapes": [[4, 4]], "group_name": SGLANG_GROUP, "flush_cache": False,
         "load_format": "flattened_bucket"},
        {"names": ["b", "v"], "dtypes": ["bfloat16", "float32"], "shapes": [[4], [4]], "group_name": SGLANG_GROUP,
         "flush_cache": True, "load_format": "flattened_bucket"}]
    calls.clear()
    engine._buckets = [[TensorSpec("fail", "float32", (1,), 4)]]
    with pytest.raises(RuntimeError, match=r"update_weights_from_distributed \(bucket 0 of 1\) failed: .*boom"):
        engine.receive_weights()
    assert calls[-1] == "end"  # the session is closed, so the next round can open one


def test_sglang_nccl_round_through_real_updater(tok_dir: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Learner rank 0 (another process, SGLang's real ``init_custom_process_group`` and ``FlattenedTensorBucket``)
    sends one round over gloo; here SGLang's real ``Engine`` -> ``TokenizerManager`` -> scheduler weight updater ->
    model runner ``WeightUpdater`` join the group and receive it (the model's load is recorded)."""
    sglang = pytest.importorskip("sglang")
    import socket

    import torch.multiprocessing as mp
    from sglang.srt.entrypoints import engine as engine_module
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.managers import tokenizer_control_mixin, tp_worker
    from sglang.srt.managers.scheduler_components import weight_updater
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater
    from sglang.srt.utils.aio_rwlock import RWLock

    from tests.unit.sglang_sync_ranks import real_learner_rank, tiny_model

    parallel = types.SimpleNamespace(tp_size=1, tp_rank=0, dp_size=1, tp_group=types.SimpleNamespace(cpu_group=None))
    for module in (engine_module, tokenizer_control_mixin, tp_worker, weight_updater):
        monkeypatch.setattr(module, "get_parallel", lambda: parallel)
    log: list = []
    receiver = WeightUpdater(tp_rank=0, device="cpu", gpu_id=0, model_config=None, custom_weight_loaders={},
                             get_model=None, update_model_fields=None, recapture_cuda_graph=None,
                             get_model_runner=None)

    class RunnerLoader:  # the model's load_weights, recorded
        def load_weights_from_distributed(self, named):  # noqa: ANN001, ANN202
            log.append(("load", [(n, t.clone()) for n, t in named]))
            return True, "Success"

        def begin_weight_update(self) -> None:
            log.append("begin")

        def end_weight_update(self, run_post_load: bool) -> None:
            log.append(("end", run_post_load))

    model_runner = types.SimpleNamespace(weight_updater=receiver)
    worker = types.SimpleNamespace(model_runner=model_runner,
                                   weight_update_runners=lambda: [("target", types.SimpleNamespace(
                                       weight_updater=RunnerLoader()))])
    worker.init_weights_update_group = lambda req: tp_worker.BaseTpWorker.init_weights_update_group(worker, req)
    scheduler = weight_updater.SchedulerWeightUpdaterManager(
        tp_worker=worker, draft_worker=None, memory_saver_adapter=None, is_fully_idle=lambda **k: True,
        flush_cache=lambda **k: log.append("flush") or True,
        scheduler=types.SimpleNamespace(record_weight_version_change=lambda new_version: None))

    def relay(handler):  # noqa: ANN001, ANN202
        async def communicator(obj):  # noqa: ANN001, ANN202
            return [handler(obj)]
        return communicator

    class WiredEngine(Engine):
        def __init__(self, **kwargs: object) -> None:
            self.loop = asyncio.new_event_loop()
            tm = TokenizerManager.__new__(TokenizerManager)
            tm.__dict__.update(
                auto_create_handle_loop=lambda: None, _is_pause=False, is_pause_cond=asyncio.Condition(),
                model_update_lock=RWLock(), mm_processor=None,
                begin_weight_update_communicator=relay(scheduler.begin_weight_update),
                end_weight_update_communicator=relay(scheduler.end_weight_update),
                init_weights_update_group_communicator=relay(scheduler.init_weights_update_group),
                update_weights_from_distributed_communicator=relay(scheduler.update_weights_from_distributed))
            self.tokenizer_manager = tm

    monkeypatch.setattr(sglang, "Engine", WiredEngine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    learner = mp.get_context("spawn").Process(target=real_learner_rank,
                                              args=("127.0.0.1", port, str(tmp_path / "learner-store"),
                                                    str(tmp_path / "sent")))
    learner.start()
    # The engine's scheduler has its own default group (its tensor-parallel one), which SGLang's updater asserts.
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'engine-store'}", rank=0,
                                         world_size=1)
    try:
        engine = sglang_mod.SGLangEngine(tok_dir)
        model = tiny_model()
        init, offsets = plan_group("127.0.0.1", port, [engine.sync_workers], buffer_bytes=40, wire="sglang")
        engine.open_device_sync({**init.worker_info(offsets[0]), "backend": "gloo"}, weight_manifest(model))
        received = engine.receive_weights()
    finally:
        learner.join(timeout=60)
        if learner.is_alive():  # the engine side failed before the learner could finish: do not leave it waiting
            learner.kill()
        torch.distributed.destroy_process_group()
    assert learner.exitcode == 0
    loads = [step[1] for step in log if isinstance(step, tuple) and step[0] == "load"]
    assert len(loads) == len(engine._buckets) > 1 and log[0] == "begin" and log[-2:] == ["flush", ("end", False)]
    state = model.state_dict()
    got = [pair for load in loads for pair in load]
    assert [n for n, _ in got] == list(state) and all(torch.equal(t, state[n]) for n, t in got)
    assert received == torch.load(tmp_path / "sent")["bytes"] == sum(t.numel() * 4 for t in state.values())
    engine.engine.loop.close()


def test_engine_capabilities_are_declared_protocols() -> None:
    """Device sync and sleep/wake are Protocols an engine meets by its methods, not names probed one by one."""
    from toolbox.engines.base import DeviceSyncable, Sleepable, WakesInStages, device_syncable

    class Receiver:
        sync_workers = 2

        def open_device_sync(self, init_info: dict, manifest: list) -> None: ...

        def receive_weights(self) -> int:
            return 0

    class Sleeper:
        def sleep(self) -> None: ...

        def wake(self) -> None: ...

    assert device_syncable(Receiver()).sync_workers == 2 and isinstance(Receiver(), DeviceSyncable)
    with pytest.raises(TypeError, match=r"Sleeper cannot receive weights device to device"):
        device_syncable(Sleeper())
    assert isinstance(Sleeper(), Sleepable) and not isinstance(Sleeper(), WakesInStages)
