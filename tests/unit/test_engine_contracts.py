"""Contracts of the vllm / sglang / http engines without a GPU.

Fake ``vllm`` / ``sglang`` modules shaped like the real outputs exercise the conversion to a
`RolloutBatch`; signature checks against the real packages run only where they are installed; the
http engine talks to a real stdlib OpenAI-style server with the real ``openai`` client.
Not covered here: real generation and the GPU weight-sync paths (CUDA IPC).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import random
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from toolbox.engines import http as http_mod
from toolbox.engines import sglang as sglang_mod
from toolbox.engines import vllm as vllm_mod
from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.engines.common import request_seeds, tensor_bytes
from toolbox.models.tiny import build_char_tokenizer
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, PromptRequest
from toolbox.rl.weights import pack_state_dict

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
    names = {f.name for f in dataclasses.fields(ServerArgs)}
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


def test_vllm_update_weights_uses_ipc_protocol(fake_vllm: types.SimpleNamespace, tok_dir: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    engine = vllm_mod.VLLMEngine(tok_dir)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(vllm_mod, "_share_on_gpus", lambda ts: ([], [{"GPU-0": ("rebuild", n)} for n in ts]))
    state = {"w": torch.ones(4, 4), "b": torch.zeros(4, dtype=torch.bfloat16)}
    loaded = engine.update_weights(pack_state_dict(state, bucket_bytes=64))
    assert loaded == 4 * 4 * 4 + 4 * 2
    methods = [c[0] for c in engine.llm.calls[1:]]
    assert methods == ["start_weight_update", "update_weights", "update_weights", "finish_weight_update",
                       "reset_prefix_cache"]
    infos = [c[1][0]["update_info"] for c in engine.llm.calls if c[0] == "update_weights"]
    assert [i["names"] for i in infos] == [["w"], ["b"]]
    assert infos[1]["dtype_names"] == ["bfloat16"] and infos[0]["shapes"] == [[4, 4]]
    with pytest.raises(RuntimeError, match="enable_sleep_mode"):
        engine.sleep()



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

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):  # noqa: ANN001, ANN201
        self.updates.append((named_tensors, flush_cache))
        return True, "Success"


def test_sglang_generate_and_update(monkeypatch: pytest.MonkeyPatch, tok_dir: str) -> None:
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=FakeEngine))
    cfg = sglang_mod.SGLangEngineConfig(stage_on_gpu=False)
    engine = sglang_mod.SGLangEngine(tok_dir, dtype="bfloat16", config=cfg, seed=7)
    assert engine.engine.kwargs["random_seed"] == 7 and engine.engine.kwargs["dtype"] == "bfloat16"
    check_batch(engine.generate(REQUESTS, SAMPLING))
    one = engine.generate(REQUESTS[:1], SAMPLING)  # SGLang answers a batch of one with a bare dict
    assert one.response_ids_BR.tolist() == [[A, B, EOS]]
    state = {"w": torch.arange(16.0).view(4, 4), "b": torch.ones(4)}
    assert engine.update_weights(pack_state_dict(state, bucket_bytes=64)) == 16 * 4 + 4 * 4
    assert [flush for _, flush in engine.engine.updates] == [False, True]  # flush the cache once, at the end
    assert torch.equal(dict(engine.engine.updates[0][0])["w"], state["w"])



class CompletionsHandler(BaseHTTPRequestHandler):
    mode = "ids"  # "ids": tokens spelled token_id:N; "text": plain text only; "bad": misaligned text
    bodies: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        ids, lps, reason = scripted(body["prompt"], body["max_tokens"])
        text = "".join("abc"[t - A] for t in ids if t != EOS)
        tokens = {"ids": [f"token_id:{t}" for t in ids], "text": list(text) + [""] * (EOS in ids)}.get(self.mode)
        if self.mode == "bad":
            tokens, lps = [text], lps[:1]
        logprobs = {"tokens": tokens, "token_logprobs": lps, "top_logprobs": None, "text_offset": None}
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
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


def test_http_misaligned_text_is_an_error(server: str, tok_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CompletionsHandler, "mode", "bad")
    engine = http_mod.HTTPEngine(tok_dir, config=http_mod.HTTPEngineConfig(base_url=server, max_retries=0))
    with pytest.raises(RuntimeError, match="log-probs"):
        engine.generate(REQUESTS[:1], SAMPLING)


def test_http_refuses_weight_updates_unless_allowed(server: str, tok_dir: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    # This server has no GET /v1/toolbox/info (it answers 501): not toolbox.serve, so it cannot take weights.
    buckets = pack_state_dict({"w": torch.ones(2)})
    with pytest.raises(NotImplementedError, match="toolbox/info answered 501") as refused:
        http_mod.HTTPEngine(tok_dir, config=http_mod.HTTPEngineConfig(base_url=server)).update_weights(buckets)
    assert "allow_stale_weights" in str(refused.value)
    stale = http_mod.HTTPEngine(tok_dir, config=http_mod.HTTPEngineConfig(base_url=server, allow_stale_weights=True))
    with caplog.at_level("WARNING"):
        assert stale.update_weights(buckets) == 0
    assert "keeps its own weights" in caplog.text
