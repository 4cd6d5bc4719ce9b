"""GPU engines against the real packages: skipped without CUDA and the package (none on the CPU machines).

Each test samples from the tiny model, then pushes modified weights through the engine's native
weight-update path and checks that greedy outputs follow the new weights, as the learner's sync would.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from toolbox.data.prompts import PromptSource
from toolbox.data.tasks import TASKS
from toolbox.engines import ENGINES, SamplingConfig
from toolbox.models.loading import load_causal_lm
from toolbox.rl.weights import pack_state_dict

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_generate_then_weight_update_changes_greedy_output(engine: str, tiny_model_dir: Path) -> None:
    pytest.importorskip(engine)
    path = str(tiny_model_dir)
    eng = ENGINES.build({"name": engine}, inject={"model_path": path, "dtype": "float32", "seed": 0})
    requests = PromptSource(TASKS.build({"name": "digit_add"}), eng.tokenizer, seed=0).step(0, 4, 2)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=4)
    before = eng.generate(requests, greedy)
    assert len(before) == len(requests) and before.response_mask_BR.sum() > 0
    assert torch.isfinite(before.logprobs_BR).all()
    # A zero LM head makes every logit equal: greedy decoding (argmax, first index on ties) must then
    # emit token 0 everywhere, with log-prob -log(vocab), if and only if the new weights arrived.
    model = load_causal_lm(path)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    eng.update_weights(pack_state_dict(model.state_dict()))
    after = eng.generate(requests, greedy)
    assert (after.response_ids_BR[:, 0] == 0).all()
    vocab = model.lm_head.weight.shape[0]
    assert torch.allclose(after.logprobs_BR[:, 0], torch.full((len(after),), -float(torch.log(torch.tensor(vocab)))),
                          atol=1e-3)


@pytest.fixture(scope="module")
def head64_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a head size of 64 (vLLM's attention kernels want >= 64), saved in bfloat16."""
    from toolbox.models.loading import TinyModelConfig
    from toolbox.models.tiny import ensure_tiny_model

    cfg = TinyModelConfig(hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256)
    return ensure_tiny_model(tmp_path_factory.mktemp("models") / "head64", cfg,
                             TASKS.build({"name": "digit_add"}).alphabet())


def test_vllm_sleep_wake_sync_round_bf16(head64_model_dir: Path) -> None:
    """Generate, sleep (weights and KV cache freed), wake, sync weights in several buckets, generate again."""
    pytest.importorskip("vllm")
    from toolbox.engines.vllm import VLLMEngine, VLLMEngineConfig

    path = str(head64_model_dir)
    cfg = VLLMEngineConfig(enable_sleep_mode=True, enforce_eager=True, gpu_memory_utilization=0.2)
    eng = VLLMEngine(path, dtype="bfloat16", config=cfg, seed=0)
    requests = PromptSource(TASKS.build({"name": "digit_add"}), eng.tokenizer, seed=0).step(0, 4, 2)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=4)
    assert eng.generate(requests, greedy).response_mask_BR.sum() > 0
    free_awake = torch.cuda.mem_get_info()[0]
    eng.sleep(level=1)
    asleep = torch.cuda.mem_get_info()[0]
    assert asleep > free_awake  # sleeping gave memory back
    eng.wake_weights()  # two-stage wake: the weights first, the KV cache after the sync
    assert torch.cuda.mem_get_info()[0] > free_awake  # the KV cache is still free during the load
    model = load_causal_lm(path, "bfloat16")
    with torch.no_grad():
        model.lm_head.weight.zero_()
    buckets = pack_state_dict(model.state_dict(), bucket_bytes=64 << 10)
    assert len(buckets) >= 3
    eng.update_weights(buckets)
    eng.wake()
    print(f"vllm free GPU memory: awake {free_awake / 2**30:.2f} GiB, asleep {asleep / 2**30:.2f} GiB, "
          f"awake again {torch.cuda.mem_get_info()[0] / 2**30:.2f} GiB")
    after = eng.generate(requests, greedy)
    assert (after.response_ids_BR[:, 0] == 0).all()  # all logits equal: argmax is token 0 iff the sync arrived


def _nccl_engine(engine: str, path: str) -> object:
    """An engine set up for the device-to-device sync, small enough to leave GPU 0 room (bf16, eager)."""
    if engine == "vllm":
        from toolbox.engines.vllm import VLLMEngine, VLLMEngineConfig

        return VLLMEngine(path, dtype="bfloat16", seed=0, weight_transfer="nccl",
                          config=VLLMEngineConfig(enforce_eager=True, gpu_memory_utilization=0.2))
    from toolbox.engines.sglang import SGLangEngine, SGLangEngineConfig

    return SGLangEngine(path, dtype="bfloat16", seed=0, config=SGLangEngineConfig(mem_fraction_static=0.2))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs the learner and the engine on different GPUs")
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_nccl_sync_from_a_learner_gpu(engine: str, head64_model_dir: Path) -> None:
    """The ``nccl`` path without Ray: the engine's worker on GPU 0, the learner's sender on GPU 1, both sides of each
    call run at the same time (a thread stands in for the concurrent Ray calls); several packed chunks / buckets."""
    pytest.importorskip(engine)
    from concurrent.futures import ThreadPoolExecutor

    from toolbox.engines.nccl_sync import NcclWeightSender, plan_group

    path = str(head64_model_dir)
    eng: Any = _nccl_engine(engine, path)
    requests = PromptSource(TASKS.build({"name": "digit_add"}), eng.tokenizer, seed=0).step(0, 4, 2)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=4)
    assert not (eng.generate(requests, greedy).response_ids_BR[:, 0] == 0).all()
    torch.cuda.set_device(1)
    model = load_causal_lm(path, "bfloat16").to("cuda:1")
    with torch.no_grad():
        model.lm_head.weight.zero_()
    sender = NcclWeightSender(model, 0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init, offsets = plan_group("127.0.0.1", port, [eng.sync_workers], buffer_bytes=64 << 10, wire=engine)
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(eng.open_device_sync, init.worker_info(offsets[0]), sender.manifest)
        sender.open(init)
        joined.result(timeout=120)
        received = pool.submit(eng.receive_weights)
        sent = sender.send()
        assert received.result(timeout=120) == sent > 3 * (64 << 10)  # several chunks
    after = eng.generate(requests, greedy)
    assert (after.response_ids_BR[:, 0] == 0).all()  # all logits equal: argmax is token 0 iff the sync arrived
    sender.close()
