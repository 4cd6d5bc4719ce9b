"""`toolbox.models.lean_llama`: the ``hf`` engine's own Llama-family model against transformers' (the reference):
the same weights under the same names, the same logits and sampled tokens, no transformers modeling code in the
process, and the transformers model wherever the lean one does not apply."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.engine_samples import assert_same_samples
from toolbox.engines.base import SamplingConfig
from toolbox.engines.hf import HFEngine, HFEngineConfig
from toolbox.models.lean_llama import LeanLlama, lean_unsupported, load_lean_llama
from toolbox.models.loading import load_causal_lm
from toolbox.rl.batch import PromptRequest
from toolbox.rl.weights import pack_state_dict

PROMPTS = ["1+2=", "13+4=", "2+2=", "9+9=", "0+0+1="]


@pytest.fixture(scope="module")
def tied_llama_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with tied embeddings, grouped-query heads and an explicit head_dim (SmolLM2's shape of config)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads((tiny_model_dir / "config.json").read_text())
    llama = LlamaConfig(vocab_size=config["vocab_size"], hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                        max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                        pad_token_id=config["pad_token_id"], eos_token_id=config["eos_token_id"])
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("models") / "tied_llama"
    LlamaForCausalLM(llama).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    return out


@pytest.fixture(params=["qwen2", "tied_llama"])
def model_dir(request: pytest.FixtureRequest, tiny_model_dir: Path, tied_llama_dir: Path) -> Path:
    return tiny_model_dir if request.param == "qwen2" else tied_llama_dir


def test_the_weights_and_logits_are_transformers(model_dir: Path) -> None:
    """Same names, shapes and values (a tied head shares the embedding); same logits of a left-padded batch at
    every real position, and of its last position alone (``logits_to_keep``)."""
    assert lean_unsupported(model_dir) is None
    lean, ref = load_lean_llama(model_dir), load_causal_lm(str(model_dir)).eval()
    ours, theirs = lean.state_dict(), ref.state_dict()
    assert list(ours) == list(theirs)
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
    if lean.config.tie_word_embeddings:
        assert lean.lm_head.weight is lean.model.embed_tokens.weight
    ids = torch.tensor([[0, 0, 5, 6, 7, 3], [4, 5, 6, 7, 8, 9]])
    mask = (ids != 0).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    got = lean(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)
    last = lean(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1).logits
    torch.testing.assert_close(last, want[:, -1:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="2-D padding mask"):
        lean(input_ids=ids, attention_mask=torch.ones(2, 1, 6, 6))


def test_an_engine_samples_the_same_tokens_on_either_model(model_dir: Path) -> None:
    """The default engine (the lean model) and one on the transformers model, seeded alike: the same tokens and
    log-probs, also after a weight sync; the lean one's state dict is what a checkpoint of the other holds."""
    lean = HFEngine(str(model_dir), seed=3)
    ref = HFEngine(str(model_dir), config=HFEngineConfig(forward="transformers"), seed=3)
    assert isinstance(lean.model, LeanLlama) and not isinstance(ref.model, LeanLlama)
    requests = [PromptRequest(lean.tokenizer(p)["input_ids"], g) for g, p in enumerate(PROMPTS) for _ in range(2)]
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0)
    moved = {k: v * 1.01 + 0.001 for k, v in ref.state_dict().items()}  # tied names stay one value
    for synced in (False, True):
        if synced:
            for engine in (lean, ref):
                engine.update_weights(pack_state_dict(moved, 1 << 30))
        assert_same_samples(lean, ref, requests, sampling, seed=7)
    assert all(torch.equal(v, moved[k]) for k, v in lean.state_dict().items())


def test_a_rollout_engine_never_imports_the_modeling_code(tiny_model_dir: Path) -> None:
    """A fresh process that builds the default engine, samples and loads weights has not imported
    ``transformers.modeling_utils`` (nor torch.distributed.tensor, which it pulls in)."""
    script = textwrap.dedent(f"""
        import sys, torch
        from toolbox.engines.base import SamplingConfig
        from toolbox.engines.hf import HFEngine
        from toolbox.rl.batch import PromptRequest
        from toolbox.rl.weights import pack_state_dict
        engine = HFEngine({str(tiny_model_dir)!r})
        engine.update_weights(pack_state_dict(engine.state_dict(), 1 << 30))
        batch = engine.generate([PromptRequest(engine.tokenizer("1+2=")["input_ids"], 0)], SamplingConfig(max_new_tokens=4))
        print(type(engine.model).__name__, batch.response_ids_BR.shape[0],
              sorted(m for m in ("transformers.modeling_utils", "torch.distributed.tensor") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["LeanLlama", "1", "[]"], out.stdout


@pytest.mark.parametrize(("edit", "why"), [
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, "RoPE"),
    ({"hidden_act": "gelu"}, "activation 'gelu'"),
    ({"use_sliding_window": True}, "sliding-window attention"),
    ({"auto_map": {"AutoModelForCausalLM": "x.Model"}}, "remote code"),
    ({"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}, "architecture"),
])
def test_a_model_it_does_not_cover_loads_as_transformers_does(tiny_model_dir: Path, tmp_path: Path, edit: dict,
                                                               why: str) -> None:
    shutil.copytree(tiny_model_dir, tmp_path / "model")
    config = tmp_path / "model" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **edit}))
    assert why in (lean_unsupported(tmp_path / "model") or "")


def test_the_transformers_model_where_the_lean_loop_does_not_run_toolboxs_forward(tiny_model_dir: Path) -> None:
    """``decode: generate``, ``forward: transformers`` and an engine that gets LoRA adapters (peft adds them to
    transformers' modules) get transformers' model; so does a hub id."""
    for config in (HFEngineConfig(decode="generate"), HFEngineConfig(forward="transformers")):
        assert not isinstance(HFEngine(str(tiny_model_dir), config=config).model, LeanLlama)
    assert not isinstance(HFEngine(str(tiny_model_dir), adapters=True).model, LeanLlama)
    assert lean_unsupported("HuggingFaceTB/SmolLM2-135M-Instruct") == "no local config.json (a hub id)"
