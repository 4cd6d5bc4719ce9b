"""What the GPU engines need at real size, checked without a GPU against fakes of the vLLM / SGLang API.

The engine's dtype (``rollout.dtype``, independent of the learner's), arguments the engine passes itself refused in
``engine_kwargs``, SGLang's host backup of the weights across a sleep, pipeline stages counted in the sync group,
the IPC sync's cast to the engine dtype and one bucket at a time on the GPU, the NCCL send ordered after the
optimizer step. Not covered: real CUDA memory and streams (tests/gpu).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from tests.unit.test_engine_contracts import FakeEngine, FakeIPC, FakeLLM, FakeSamplingParams
from toolbox.config.schema import ExperimentConfig
from toolbox.core.errors import ConfigError
from toolbox.engines import sglang as sglang_mod
from toolbox.engines import vllm as vllm_mod
from toolbox.models.tiny import build_char_tokenizer
from toolbox.rl.weights import pack_state_dict


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tok")
    build_char_tokenizer("abc").save_pretrained(path)
    return str(path)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM, SamplingParams=FakeSamplingParams,
                                                                   TokensPrompt=dict))
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


class SleepyEngine(FakeEngine):
    """SGLang's memory saver: a sleep without ``enable_weights_cpu_backup`` discards the weights."""

    def release_memory_occupation(self) -> None:
        self.weights_kept = bool(self.kwargs.get("enable_weights_cpu_backup"))

    def resume_memory_occupation(self) -> None:
        pass


def _sglang(monkeypatch: pytest.MonkeyPatch, tok_dir: str, **options: object) -> sglang_mod.SGLangEngine:
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=SleepyEngine))
    config = sglang_mod.SGLangEngineConfig(enable_memory_saver=True, stage_on_gpu=False, **options)
    return sglang_mod.SGLangEngine(tok_dir, config=config)


def test_sglang_memory_saver_keeps_a_host_copy_of_the_weights(monkeypatch: pytest.MonkeyPatch, tok_dir: str) -> None:
    from tests.unit.test_engine_contracts import REQUESTS, SAMPLING

    engine = _sglang(monkeypatch, tok_dir)
    assert engine.engine.kwargs["enable_weights_cpu_backup"] is True
    engine.sleep()
    engine.wake()
    assert engine.engine.weights_kept
    engine.generate(REQUESTS, SAMPLING)  # a wake with no weight load (a retried generate) samples the same weights


def test_sglang_without_backup_refuses_to_generate_until_weights_load(monkeypatch: pytest.MonkeyPatch,
                                                                      tok_dir: str) -> None:
    from tests.unit.test_engine_contracts import REQUESTS, SAMPLING

    engine = _sglang(monkeypatch, tok_dir, weights_cpu_backup=False)
    assert engine.engine.kwargs["enable_weights_cpu_backup"] is False
    engine.sleep()
    engine.wake()
    with pytest.raises(RuntimeError, match="generate after a sleep that discarded the weights"):
        engine.generate(REQUESTS, SAMPLING)
    engine.update_weights(pack_state_dict({"w": torch.ones(2)}, bucket_bytes=64))
    engine.generate(REQUESTS, SAMPLING)


@pytest.mark.parametrize(("engine", "expected"), [("vllm", "bfloat16"), ("sglang", "bfloat16"), ("hf", "float32")])
def test_rollout_dtype_defaults_to_bf16_on_gpu_engines(engine: str, expected: str) -> None:
    from toolbox.algorithms.base import rollout_dtype

    cfg = ExperimentConfig.model_validate({"rollout": {"engine": {"name": engine}}})
    assert cfg.model.dtype == "float32" and rollout_dtype(cfg) == expected
    pinned = ExperimentConfig.model_validate({"rollout": {"engine": {"name": engine}, "dtype": "float16"}})
    assert rollout_dtype(pinned) == "float16"


def test_engine_gets_rollout_dtype_not_the_learners(fake_vllm: None, tok_dir: str) -> None:
    from toolbox.algorithms.base import build_engine, rollout_dtype
    from toolbox.engines import ENGINES

    cfg = ExperimentConfig.model_validate({"rollout": {"engine": {"name": "vllm"}}})
    engine = build_engine(ENGINES, cfg.rollout.engine, tok_dir, rollout_dtype(cfg), 0, 0)
    assert engine.llm.kwargs["dtype"] == "bfloat16"


@pytest.mark.parametrize(("engine", "key", "use"), [("vllm", "dtype", "rollout.dtype"),
                                                    ("vllm", "data_parallel_size", "rollout.num_workers"),
                                                    ("sglang", "dtype", "rollout.dtype"),
                                                    ("sglang", "tp_size", "rollout.engine.tp_size")])
def test_engine_kwargs_may_not_repeat_what_the_engine_passes(engine: str, key: str, use: str) -> None:
    with pytest.raises(ValueError, match=rf"engine_kwargs: {key} is passed to .* \({key}: set {use}"):
        ExperimentConfig.model_validate({"rollout": {"engine": {"name": engine, "engine_kwargs": {key: 2}}}})


@pytest.mark.parametrize(("engine", "pp_key"), [("vllm", "pipeline_parallel_size"), ("sglang", "pp_size")])
def test_pipeline_stages_count_in_sync_group_and_gpus(engine: str, pp_key: str) -> None:
    tp = "tensor_parallel_size" if engine == "vllm" else "tp_size"
    spec = {"name": engine, tp: 2, "engine_kwargs": {pp_key: 2}}
    with pytest.raises(ConfigError, match=rf"{tp} is 2 \(x 2 pipeline stages\) .* set rollout.gpus_per_worker: 4"):
        ExperimentConfig.model_validate({"rollout": {"engine": spec, "gpus_per_worker": 2}})
    cfg = ExperimentConfig.model_validate({"rollout": {"engine": spec, "gpus_per_worker": 4}})
    assert cfg.rollout.engine.sync_workers == 4  # type: ignore[attr-defined]


def test_ipc_sync_casts_to_engine_dtype_one_bucket_at_a_time(fake_vllm: None, tok_dir: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    engine = vllm_mod.VLLMEngine(tok_dir, dtype="bfloat16")
    ipc = FakeIPC(monkeypatch)
    alive: list[int] = []
    infos: list[dict] = []

    def update_weights(request: dict) -> None:
        infos.append(request["update_info"])
        alive.append(sum(ref() is not None for ref in ipc.copies))

    engine.llm.update_weights = update_weights
    state = {f"w{k}": torch.full((4, 4), float(k)) for k in range(4)} | {"steps": torch.arange(3)}
    loaded = engine.update_weights(pack_state_dict(state, bucket_bytes=64))
    assert [i["dtype_names"] for i in infos] == [["bfloat16"]] * 4 + [["int64"]]
    assert loaded == 4 * 16 * 2 + 3 * 8  # bf16 weights, the integer buffer as it is
    assert alive == [1] * 5  # the previous bucket's GPU copy is gone when the next one is sent
    assert isinstance(infos[0]["ipc_handles"][0][FakeIPC.UUID], tuple)


def test_sglang_staged_buckets_in_engine_dtype(monkeypatch: pytest.MonkeyPatch, tok_dir: str) -> None:
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=FakeEngine))
    engine = sglang_mod.SGLangEngine(tok_dir, dtype="bfloat16", config=sglang_mod.SGLangEngineConfig(stage_on_gpu=False))
    engine.update_weights(pack_state_dict({"w": torch.ones(4), "n": torch.arange(2)}, bucket_bytes=1 << 10))
    sent = dict(engine.engine.updates[1][0])
    assert sent["w"].dtype == torch.bfloat16 and sent["n"].dtype == torch.int64
