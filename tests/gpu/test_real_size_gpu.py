"""What only a GPU shows of the fixes for real-size runs: skipped without CUDA (and without the engine package where
one is needed). Each test prints one line of what it measured; scripts/gpu_checks.sh runs them.

- the PPO critic under FSDP2 bf16 mixed precision and in a bf16 model, on cuda;
- a single rank with ``mixed_precision: bf16`` (autocast) tracking the fp32 losses;
- SGLang woken after a sleep with no weight load samples what it sampled before (its host copy of the weights);
- the NCCL send ordered after a slow in-place update queued on the learner's stream (2 GPUs);
- the vLLM IPC sync of an fp32 learner into a bf16 engine holding one bucket at a time on the GPU;
- a few GRPO steps of the tiny Qwen2 with the hf engine on the learner's GPU: peak memory against the dry run's
  estimate, and tokens/s.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from toolbox.data.prompts import PromptSource
from toolbox.data.tasks import TASKS
from toolbox.engines import ENGINES, SamplingConfig
from toolbox.learner.config import LearnerConfig
from toolbox.learner.policy import PolicyRank
from toolbox.learner.strategy import Placement, backend_for, peak_memory_gb, resolve_device, wrap
from toolbox.models.loading import load_causal_lm
from toolbox.models.logprobs import response_logprobs
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.weights import pack_state_dict

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=4)


@pytest.fixture(scope="module")
def nccl_group() -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(backend_for("auto", resolve_device("auto")), init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _rows(vocab: int, n: int = 8) -> RolloutBatch:
    gen = torch.Generator().manual_seed(0)
    return RolloutBatch(prompt_ids_BP=torch.randint(3, vocab, (n, 6), generator=gen),
                        prompt_mask_BP=torch.ones(n, 6, dtype=torch.long),
                        response_ids_BR=torch.randint(3, vocab, (n, 8), generator=gen),
                        response_mask_BR=torch.ones(n, 8, dtype=torch.long), logprobs_BR=torch.zeros(n, 8),
                        group_B=torch.arange(n), finish_B=torch.zeros(n, dtype=torch.long))


@pytest.mark.parametrize(("dtype", "precision"), [("float32", "bf16"), ("bfloat16", "fp32")])
def test_critic_on_cuda_under_bf16(nccl_group: None, tiny_model_dir: Path, dtype: str, precision: str) -> None:
    from toolbox.models.value import load_value_model, response_values

    cfg = LearnerConfig(num_workers=1, strategy="fsdp2", device="cuda", mixed_precision=precision)
    critic = wrap(load_value_model(str(tiny_model_dir), dtype).train(), "fsdp2", Placement.of(cfg))
    values = response_values(critic, _rows(critic.model.config.vocab_size))
    values.pow(2).mean().backward()
    print(f"\ncritic {dtype} / {precision}: values {values.dtype}, head grad {critic.head.weight.grad.dtype}")
    assert values.dtype == torch.float32 and torch.isfinite(values).all()


def test_single_rank_bf16_tracks_fp32(tiny_model_dir: Path) -> None:
    losses: dict[str, list[float]] = {}
    for precision in ("fp32", "bf16"):
        cfg = LearnerConfig(num_workers=1, strategy="single", device="cuda", mixed_precision=precision,
                            optim={"lr": 3e-3, "scheduler": "constant"})
        torch.manual_seed(0)
        torch.cuda.reset_peak_memory_stats()
        policy = PolicyRank.pretrained(str(tiny_model_dir), "float32", cfg, 5)
        batch = _rows(policy.model.config.vocab_size)
        for _ in range(5):
            logp = response_logprobs(policy.model, batch, 1.0)
            loss = -(logp * batch.response_mask_BR).sum() / batch.response_mask_BR.sum()
            loss.backward()
            losses.setdefault(precision, []).append(float(loss))
            policy.optimizer_step()
        print(f"\nsingle rank {precision}: losses {losses[precision]}, peak {peak_memory_gb(torch.device('cuda')):.3f} GB")
    assert max(abs(a - b) for a, b in zip(losses["fp32"], losses["bf16"])) < 2e-2


def test_sglang_wake_without_weight_load_samples_the_same(tiny_model_dir: Path) -> None:
    pytest.importorskip("sglang")
    from toolbox.engines.sglang import SGLangEngine, SGLangEngineConfig

    eng = SGLangEngine(str(tiny_model_dir), dtype="bfloat16", seed=0,
                       config=SGLangEngineConfig(enable_memory_saver=True, mem_fraction_static=0.2))
    requests = PromptSource(TASKS.build({"name": "digit_add"}), eng.tokenizer, seed=0).step(0, 4, 2)
    before = eng.generate(requests, GREEDY)
    eng.sleep()
    eng.wake()  # no weight load between (a retried generate, DAPO's next round)
    after = eng.generate(requests, GREEDY)
    print(f"\nsglang greedy before/after sleep+wake equal: {torch.equal(before.response_ids_BR, after.response_ids_BR)}")
    assert torch.equal(before.response_ids_BR, after.response_ids_BR)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs the learner and the engine on different GPUs")
def test_nccl_send_waits_for_an_update_still_queued(tiny_model_dir: Path) -> None:
    """The learner zeroes the LM head behind a long kernel on its stream and sends at once: vLLM's producer streams
    must not read the head before the zeroing ran."""
    pytest.importorskip("vllm")
    from concurrent.futures import ThreadPoolExecutor

    from tests.gpu.test_engines_gpu import _nccl_engine
    from toolbox.engines.nccl_sync import NcclWeightSender, plan_group

    path = str(_head64(tiny_model_dir.parent))
    eng: object = _nccl_engine("vllm", path)
    requests = PromptSource(TASKS.build({"name": "digit_add"}), eng.tokenizer, seed=0).step(0, 4, 2)  # type: ignore[attr-defined]
    torch.cuda.set_device(1)
    model = load_causal_lm(path, "bfloat16").to("cuda:1")
    sender = NcclWeightSender(model, 0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init, offsets = plan_group("127.0.0.1", port, [1], buffer_bytes=64 << 10)
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(eng.open_device_sync, init.worker_info(offsets[0]), sender.manifest)  # type: ignore[attr-defined]
        sender.open(init)
        joined.result(timeout=120)
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time queued ahead of the update
        with torch.no_grad():
            model.lm_head.weight.mul_(0)
        received = pool.submit(eng.receive_weights)  # type: ignore[attr-defined]
        sender.send()
        received.result(timeout=120)
    after = eng.generate(requests, GREEDY)  # type: ignore[attr-defined]
    print(f"\nnccl send after a queued update: first tokens {after.response_ids_BR[:, 0].tolist()}")
    assert (after.response_ids_BR[:, 0] == 0).all()
    sender.close()


def _head64(root: Path) -> Path:
    from toolbox.models.loading import TinyModelConfig
    from toolbox.models.tiny import ensure_tiny_model

    cfg = TinyModelConfig(hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256, num_layers=4)
    return ensure_tiny_model(root / "head64-4", cfg, TASKS.build({"name": "digit_add"}).alphabet())


def test_vllm_ipc_sync_holds_one_bucket_in_engine_dtype(tiny_model_dir: Path) -> None:
    pytest.importorskip("vllm")
    from toolbox.engines.vllm import VLLMEngine, VLLMEngineConfig

    path = str(_head64(tiny_model_dir.parent))
    eng = VLLMEngine(path, dtype="bfloat16", seed=0,
                     config=VLLMEngineConfig(enforce_eager=True, gpu_memory_utilization=0.2))
    state = load_causal_lm(path, "float32").state_dict()
    bucket = 64 << 10
    buckets = pack_state_dict(state, bucket_bytes=bucket)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    eng.update_weights(buckets)
    held = torch.cuda.max_memory_allocated() - base  # this process's copies (the engine's workers are elsewhere)
    full = sum(t.numel() for t in state.values()) * 4
    print(f"\nvllm IPC sync: {len(buckets)} buckets, peak {held / 2**10:.0f} KiB held, fp32 model {full / 2**10:.0f} KiB")
    # One bucket's bf16 copies, plus the fp32 copy of the tensor being cast; never the whole model.
    assert held <= bucket + 2 * max(t.numel() * 4 for t in state.values()) < full


def test_grpo_steps_with_hf_engine_on_the_same_gpu(nccl_group: None, tiny_model_dir: Path) -> None:
    from tests.unit.learner_steps import online_step
    from toolbox.algorithms.grpo.config import GRPOConfig
    from toolbox.algorithms.grpo.learner import GRPOLearner
    from toolbox.config import load_config
    from toolbox.driver.memory_estimate import memory_lines
    from toolbox.driver.model_shape import model_shape
    from toolbox.rewards.base import RewardResult

    cfg = LearnerConfig(num_workers=1, strategy="fsdp2", device="cuda", mixed_precision="bf16",
                        micro_batch_size=16, optim={"lr": 1e-3, "scheduler": "constant"})
    algo = GRPOConfig(prompts_per_step=8, group_size=4, kl_coef=0.05)
    torch.cuda.reset_peak_memory_stats()
    learner = GRPOLearner(str(tiny_model_dir), "float32", cfg, algo, total_steps=3)
    engine = ENGINES.build({"name": "hf", "device": "cuda"}, inject={"model_path": str(tiny_model_dir), "seed": 0})
    prompts = PromptSource(TASKS.build({"name": "digit_add"}), engine.tokenizer, seed=0)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8)
    tokens, seconds = 0, 0.0
    for step in range(3):
        start = time.perf_counter()
        batch = engine.generate(prompts.step(step, algo.prompts_per_step, algo.group_size), sampling)
        seconds += time.perf_counter() - start
        tokens += int(batch.response_mask_BR.sum())
        reward = (batch.response_ids_BR[:, 0] % 2).float()  # a rule on the sampled tokens: memory and speed only
        online_step(learner, [batch], [RewardResult(reward, torch.zeros(len(batch), dtype=torch.long), [""] * len(batch))])
        engine.update_weights(learner.policy.export_weights())
    peak = peak_memory_gb(torch.device("cuda"))
    dry = load_config([f"model.path={tiny_model_dir}", "model.tiny=null", "learner.num_workers=1",
                       "learner.strategy=fsdp2", "learner.gpus_per_worker=1", "learner.mixed_precision=bf16",
                       "learner.micro_batch_size=16", "rollout.sampling.max_new_tokens=8"])
    estimate = sum(line.bytes for line in memory_lines(dry, model_shape(dry)) if line.where == "cuda") / 2**30
    print(f"\nGRPO x3 on one GPU (hf engine + FSDP2 bf16 learner): peak {peak:.3f} GB (learner estimate "
          f"{estimate:.3f} GB, engine on top), hf engine {tokens / seconds:.0f} tokens/s")
    assert peak > 0 and tokens > 0
