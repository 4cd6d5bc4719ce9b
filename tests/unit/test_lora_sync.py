"""Adapter-only weight sync (`learner.lora.sync: adapter`): the learner sends the LoRA tensors alone, the hf engine
applies them with peft and then generates exactly like an engine given the merged weights; the vllm engine turns
them into a LoRA request (a contract test on a fake ``vllm``: vLLM itself does not run here); the config refuses
engines that cannot take adapters. No Ray."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from tests.engine_samples import assert_same_samples
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.engines.base import SamplingConfig
from toolbox.engines.hf import HFEngine
from toolbox.learner.config import LearnerConfig
from toolbox.learner.lora import LoraConfig, sync_buckets
from toolbox.learner.policy import PolicyRank
from toolbox.models.loading import load_causal_lm
from toolbox.models.logprobs import response_logprobs
from toolbox.rl.batch import PromptRequest, RolloutBatch

peft = pytest.importorskip("peft")
LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"], "sync": "adapter"}
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=5)


def _rows(vocab: int) -> RolloutBatch:
    gen = torch.Generator().manual_seed(3)
    return RolloutBatch(
        prompt_ids_BP=torch.randint(3, vocab, (4, 5), generator=gen), prompt_mask_BP=torch.ones(4, 5, dtype=torch.long),
        response_ids_BR=torch.randint(3, vocab, (4, 6), generator=gen), response_mask_BR=torch.ones(4, 6, dtype=torch.long),
        logprobs_BR=torch.zeros(4, 6), group_B=torch.arange(4), finish_B=torch.zeros(4, dtype=torch.long),
    )


def _train_step(policy: PolicyRank, batch: RolloutBatch) -> None:
    (-response_logprobs(policy.model, batch, 1.0).mean()).backward()
    policy.optimizer_step()


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> PolicyRank:
    cfg = LearnerConfig(num_workers=1, strategy="single", lora=LORA, optim={"lr": 1e-2, "scheduler": "constant"})
    torch.manual_seed(0)
    return PolicyRank.pretrained(str(tiny_model_dir), "float32", cfg, 4)


def test_hf_engine_takes_the_adapter_alone_and_generates_as_with_merged_weights(policy: PolicyRank,
                                                                              tiny_model_dir: Path) -> None:
    batch = _rows(policy.model.config.vocab_size)
    adapter_engine, merged_engine = HFEngine(str(tiny_model_dir), seed=5), HFEngine(str(tiny_model_dir), seed=5)
    lora = policy.cfg.lora
    assert lora is not None
    merged_lora = lora.model_copy(update={"sync": "merged"})
    for step in range(2):  # the second sync overwrites the adapter the first one added
        _train_step(policy, batch)
        buckets = policy.export_weights()
        names = [spec.name for b in buckets for spec in b.manifest]
        assert names and all(".lora_A.weight" in n or ".lora_B.weight" in n for n in names), names[:3]
        assert all(b.adapter == lora.model_dump() for b in buckets)
        merged = sync_buckets(policy.full_state_dict(), merged_lora, 1 << 30)
        sent = adapter_engine.update_weights(buckets)
        assert sent == sum(b.nbytes for b in buckets) < sum(b.nbytes for b in merged) / 5
        merged_engine.update_weights(merged)
        if step == 0:
            peft_model = adapter_engine.model
            assert isinstance(peft_model, peft.PeftModel)
        assert adapter_engine.model is peft_model  # loaded in place, not wrapped again
        policy.model.eval()
        want = _logits(policy.model, batch.prompt_ids_BP)
        policy.model.train()
        torch.testing.assert_close(_logits(adapter_engine.model, batch.prompt_ids_BP), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(_logits(merged_engine.model, batch.prompt_ids_BP), want, rtol=1e-5, atol=1e-5)
    requests = [PromptRequest(row.tolist(), i) for i, row in enumerate(batch.prompt_ids_BP)]
    assert_same_samples(adapter_engine, merged_engine, requests, SAMPLING, seed=11, rtol=1e-4)


def test_an_update_that_does_not_fit_the_adapters_names_what_is_wrong(policy: PolicyRank, tiny_model_dir: Path) -> None:
    engine = HFEngine(str(tiny_model_dir))
    buckets = policy.export_weights()
    other = LoraConfig(**{**LORA, "target_modules": ["q_proj"]})  # the engine's adapters lack v_proj, down_proj
    for bucket in buckets:
        bucket.adapter = other.model_dump()
    with pytest.raises(KeyError, match=r"does not fit the engine's adapters: unexpected \['base_model\.model\.model\."
                                       r"layers\.0\.mlp\.down_proj\.lora_A\.weight'"):
        engine.update_weights(buckets)


@pytest.mark.parametrize(("engine", "message"), [
    ("{name: sglang}", r"learner\.lora\.sync: adapter: rollout\.engine 'sglang' does not take LoRA adapters .*"
                       r"use learner\.lora\.sync: merged"),
    ("{name: multi_turn, engine: {name: sglang}}", r"rollout\.engine\.engine 'sglang' does not take LoRA adapters"),
    ("{name: vllm}", r"needs rollout\.engine\.engine_kwargs \{enable_lora: true, max_lora_rank: >= 4\} .*got "
                     r"enable_lora=None, max_lora_rank=16"),
    ("{name: vllm, engine_kwargs: {enable_lora: true, max_lora_rank: 2}}", r"max_lora_rank=2"),
])
def test_adapter_sync_needs_an_engine_that_takes_adapters(engine: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(["experiment=grpo_tiny", "learner.lora={r: 4, sync: adapter}", f"rollout.engine={engine}"])


def test_engines_that_take_adapters_pass_the_check() -> None:
    for engine in ("{name: hf}", "{name: multi_turn}", "{name: vllm, engine_kwargs: {enable_lora: true}}"):
        cfg = load_config(["experiment=grpo_tiny", "learner.lora={r: 4, sync: adapter}", f"rollout.engine={engine}"])
        assert cfg.learner.lora is not None and cfg.learner.lora.sync == "adapter"


@dataclasses.dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class FakeLLM:
    """Records the LoRA request of every generate and the adapters removed; each prompt gets EOS back."""

    def __init__(self, **kwargs: object) -> None:
        self.lora_requests: list[FakeLoRARequest | None] = []
        self.removed: list[int] = []
        self.llm_engine = types.SimpleNamespace(remove_lora=self.removed.append)

    def init_weight_transfer_engine(self, info: dict) -> None: ...

    def reset_prefix_cache(self) -> None: ...

    def generate(self, prompts: list, sampling_params: list, *, use_tqdm: bool = True,
                 lora_request: FakeLoRARequest | None = None) -> list:
        self.lora_requests.append(lora_request)
        done = types.SimpleNamespace(token_ids=[2], logprobs=[{2: types.SimpleNamespace(logprob=-0.1)}],
                                     finish_reason="stop")
        return [types.SimpleNamespace(outputs=[done]) for _ in prompts]


def test_vllm_engine_serves_each_adapter_version_as_a_new_lora_request(policy: PolicyRank, tiny_model_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    request_mod = types.SimpleNamespace(LoRARequest=FakeLoRARequest)
    fake = types.SimpleNamespace(LLM=FakeLLM, SamplingParams=lambda **kw: kw, TokensPrompt=dict,
                                 lora=types.SimpleNamespace(request=request_mod))
    for name, module in (("vllm", fake), ("vllm.lora", fake.lora), ("vllm.lora.request", request_mod)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from toolbox.engines.vllm import VLLMEngine

    engine = VLLMEngine(str(tiny_model_dir))
    llm = engine.llm
    requests = [PromptRequest([3, 4], 0)]
    engine.generate(requests, SAMPLING)  # before any sync: the base model, no LoRA request
    batch = _rows(policy.model.config.vocab_size)
    paths = []
    for version in (1, 2):
        engine.update_weights(policy.export_weights())  # adapter buckets: no GPU, no IPC transfer needed
        engine.generate(requests, SAMPLING)
        request = llm.lora_requests[-1]
        assert request is not None and request.lora_int_id == version, "a new id, so vLLM loads the new adapter"
        paths.append(request.lora_path)
        # What vLLM reads from lora_path is a peft adapter directory: peft loads it onto the base model.
        loaded = peft.PeftModel.from_pretrained(load_causal_lm(str(tiny_model_dir)), request.lora_path).eval()
        policy.model.eval()
        torch.testing.assert_close(_logits(loaded, batch.prompt_ids_BP), _logits(policy.model, batch.prompt_ids_BP),
                                   rtol=1e-5, atol=1e-5)
        policy.model.train()
        _train_step(policy, batch)
    assert llm.lora_requests[0] is None and llm.removed == [1]  # version 1 left the engine when 2 came
    assert not os.path.exists(paths[0]) and os.path.exists(paths[1])


def test_vllm_lora_api_we_call_exists() -> None:
    """Where vLLM is installed (scripts/engine_contracts.sh): the names and signatures the adapter path calls."""
    vllm = pytest.importorskip("vllm")
    from vllm.lora.request import LoRARequest

    LoRARequest(lora_name="policy-v1", lora_int_id=1, lora_path="/tmp/adapter")
    inspect.signature(vllm.LLM.generate).bind(object(), [], sampling_params=[], use_tqdm=False, lora_request=None)
    from vllm.v1.engine.llm_engine import LLMEngine

    assert callable(LLMEngine.remove_lora)
    assert {"enable_lora", "max_lora_rank"} <= {f.name for f in dataclasses.fields(vllm.EngineArgs)}
