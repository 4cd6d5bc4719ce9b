"""`toolbox.models.lean_llama`: toolbox's own Llama-family model against transformers' (the reference): the same
weights under the same names, the same logits, gradients and sampled tokens, the same learner update, no
transformers modeling code in a rollout worker's or a learner rank's process, and the transformers model wherever
the lean one does not apply."""

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
from tests.unit.learner_steps import online_step
from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.grpo.learner import GRPOLearner
from toolbox.engines.base import SamplingConfig
from toolbox.engines.hf import HFEngine, HFEngineConfig
from toolbox.learner.config import LearnerConfig
from toolbox.learner.policy import trained_loader
from toolbox.learner.row_packing import pack_rows
from toolbox.models.lean_llama import LeanLlama, lean_unsupported, load_lean_llama
from toolbox.models.loading import load_causal_lm
from toolbox.models.reward_head import load_reward_model
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import PromptRequest, RolloutBatch
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


def test_weights_that_do_not_fit_the_config_load_as_transformers_model_in_engine_and_learner(
        tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A directory whose config the lean module covers but whose weights carry a tensor it has no place for: the
    engine and the learner both say so and load transformers' model (one rule, `lean_or`)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_model_dir, tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    save_file({**load_file(weights), "model.extra.weight": torch.zeros(2)}, weights, metadata={"format": "pt"})
    path = str(tmp_path / "model")
    assert lean_unsupported(path) is None
    with caplog.at_level("WARNING", logger="toolbox"):
        engine = HFEngine(path).model
        learner = trained_loader(path, LearnerConfig(num_workers=1), load_causal_lm)(path, "float32")
    assert not isinstance(engine, LeanLlama) and not isinstance(learner, LeanLlama)
    assert [r.getMessage().count("unexpected ['model.extra.weight']") for r in caplog.records].count(1) == 2


def _rows(vocab: int) -> RolloutBatch:
    """Four left-padded prompts (two groups of two rows sharing one), right-padded responses, one token id 0."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, vocab, (2, 5), generator=gen).repeat_interleave(2, dim=0)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1]] * 2 + [[1, 1, 1, 1, 1]] * 2)
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    response = torch.randint(0, vocab, (4, 4), generator=gen) * response_mask
    return RolloutBatch(prompt * prompt_mask, prompt_mask, response, response_mask, torch.zeros(4, 4),
                        torch.tensor([0, 0, 1, 1]), torch.zeros(4, dtype=torch.long))


def _inputs(kind: str, vocab: int) -> dict[str, torch.Tensor | None]:
    """A forward's inputs as the learners pass them: padded rows with a 2-D mask, packed rows (no mask, positions
    restarting), and packed rows sharing prompts with a 4-D mask, boolean (sdpa) or additive (eager)."""
    rows = _rows(vocab)
    if kind == "padded":
        ids, mask, pos = rows.model_inputs()
        return {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
    packed = pack_rows(rows, 0, share_prompts=kind != "packed")
    inputs = packed.model_inputs(torch.float32 if kind == "additive" else None)
    return {k: v for k, v in inputs.items() if k != "use_cache"}  # type: ignore[misc]


@pytest.mark.parametrize("kind", ["padded", "packed", "shared_prompts", "additive"])
def test_the_training_forward_and_its_gradients_are_transformers(model_dir: Path, kind: str) -> None:
    """In train mode, the logits at every position a loss reads and the gradient of every parameter are
    transformers' own (the pad token's embedding takes none: token id 0 appears in a response)."""
    lean, ref = load_lean_llama(model_dir).train(), load_causal_lm(str(model_dir)).train()
    inputs = _inputs(kind, lean.config.vocab_size)
    real = inputs["attention_mask"].bool() if kind == "padded" else torch.ones_like(inputs["input_ids"]).bool()
    got, want = lean(**inputs).logits, ref(**inputs, use_cache=False).logits
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    (got[real] ** 2).mean().backward()
    (want[real] ** 2).mean().backward()
    ours = dict(lean.named_parameters())
    for name, param in ref.named_parameters():
        torch.testing.assert_close(ours[name].grad, param.grad, atol=1e-6, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_activation_checkpointing_recomputes_the_same_gradients(tiny_model_dir: Path) -> None:
    plain, recomputed = load_lean_llama(tiny_model_dir).train(), load_lean_llama(tiny_model_dir).train()
    recomputed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    inputs = _inputs("shared_prompts", plain.config.vocab_size)
    for model in (plain, recomputed):
        (model(**inputs).logits ** 2).mean().backward()
    for (name, a), b in zip(plain.named_parameters(), recomputed.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=0, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
    with pytest.raises(ValueError, match="use_reentrant=False"):
        recomputed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})


def _grpo(model_dir: Path, **learner: object) -> GRPOLearner:
    cfg = LearnerConfig(num_workers=1, strategy="single", device="cpu", micro_batch_size=4, packing=True,
                        share_prompts=True, optim={"lr": 1e-2, "scheduler": "constant"}, **learner)
    return GRPOLearner(str(model_dir), "float32", cfg, GRPOConfig(prompts_per_step=2, group_size=2, kl_coef=0.1),
                       total_steps=2)


def test_a_learner_trains_the_lean_model_to_the_transformers_models_weights(tiny_model_dir: Path) -> None:
    """``learner.forward: auto`` (the default) trains a `LeanLlama` policy beside a `LeanLlama` reference; two GRPO
    steps over packed rows that share prompts move it to the weights transformers' model reaches."""
    lean, ref = _grpo(tiny_model_dir), _grpo(tiny_model_dir, forward="transformers")
    assert isinstance(lean.policy.model, LeanLlama) and isinstance(lean.policy.ref, LeanLlama)
    assert not isinstance(ref.policy.model, LeanLlama) and not isinstance(ref.policy.ref, LeanLlama)
    rows = _rows(lean.policy.model.config.vocab_size)
    rewards = RewardResult(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long), [""] * 4)
    for _ in range(2):
        got, want = online_step(lean, [rows], [rewards]), online_step(ref, [rows], [rewards])
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7)
    theirs = ref.policy.full_state_dict()
    for name, value in lean.policy.full_state_dict().items():
        torch.testing.assert_close(value, theirs[name], atol=1e-6, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_the_learner_keeps_transformers_model_where_the_lean_one_does_not_apply(tiny_model_dir: Path) -> None:
    """``forward: transformers``, LoRA adapters (peft wraps transformers' modules), another head (a reward model)
    and a directory it does not cover keep the loader the learner was given."""
    auto, lora = LearnerConfig(num_workers=1), LearnerConfig(num_workers=1, lora={"r": 4})
    assert isinstance(trained_loader(str(tiny_model_dir), auto, load_causal_lm)(str(tiny_model_dir), "float32"),
                      LeanLlama)
    assert trained_loader(str(tiny_model_dir), LearnerConfig(num_workers=1, forward="transformers"),
                          load_causal_lm) is load_causal_lm
    assert trained_loader(str(tiny_model_dir), lora, load_causal_lm) is load_causal_lm
    assert trained_loader(str(tiny_model_dir), auto, load_reward_model) is load_reward_model
    assert trained_loader("HuggingFaceTB/SmolLM2-135M-Instruct", auto, load_causal_lm) is load_causal_lm


def test_a_learner_rank_never_imports_the_modeling_code(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A fresh process that builds the default GRPO learner, takes a step, exports its weights and saves a
    checkpoint has not imported ``transformers.modeling_utils``; nor, up to the checkpoint (whose
    ``torch.distributed.checkpoint`` state dict imports it), ``torch._dynamo``, which torch's optimizer wrappers would
    import (`toolbox.learner.optimizers.eager`)."""
    script = textwrap.dedent(f"""
        import sys, torch
        from tests.unit.test_lean_llama import _grpo, _rows
        from tests.unit.learner_steps import online_step
        from toolbox.rewards.base import RewardResult
        learner = _grpo({str(tiny_model_dir)!r})
        rewards = RewardResult(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long), [""] * 4)
        online_step(learner, [_rows(learner.policy.model.config.vocab_size)], [rewards])
        learner.policy.export_weights()
        dynamo = "torch._dynamo" in sys.modules
        learner.policy.save({str(tmp_path / "ckpt")!r})
        print(type(learner.policy.model).__name__, "transformers.modeling_utils" in sys.modules, dynamo)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["LeanLlama", "False", "False"], out.stdout

