"""`toolbox.engines.hf.HFEngine` on a tiny model: shapes, EOS masks, finish codes, log-probs, greedy determinism."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.engines.hf import HFEngine, _response_mask, left_pad
from toolbox.models.loading import load_causal_lm
from toolbox.models.logprobs import response_logprobs
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, PromptRequest, RolloutBatch
from toolbox.rl.weights import pack_state_dict

PROMPTS = ["1+2=", "13+4=", "2+2=", "9+9=", "0+0+1=", "3+3=", "4+1=", "12+12="]


def requests(engine: HFEngine, repeat: int = 2) -> list[PromptRequest]:
    return [PromptRequest(engine.tokenizer(p)["input_ids"], g, {"answer": str(g)}) for g, p in enumerate(PROMPTS)
            for _ in range(repeat)]


def transformers_engine(path: Path, seed: int) -> HFEngine:
    """An engine on the transformers model, which every decode path and forward can run on, decoding as the default
    does (toolbox's own forward)."""
    eng = ENGINES.build({"name": "hf", "forward": "transformers"}, inject={"model_path": str(path), "seed": seed})
    eng.config = eng.config.model_copy(update={"forward": "auto"})
    return eng


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFEngine:
    return transformers_engine(tiny_model_dir, seed=0)


@pytest.fixture(scope="module")
def eos_engine(tiny_model_dir: Path) -> HFEngine:
    """The tiny model with a bias towards EOS, so some rows stop early and some run to the length limit."""
    eng = transformers_engine(tiny_model_dir, seed=1)
    old = eng.model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[eng.tokenizer.eos_token_id] = 0.7
    eng.model.lm_head = head
    return eng


@pytest.fixture(scope="module")
def learner_model(tiny_model_dir: Path) -> torch.nn.Module:
    """The learner's own copy of the same weights."""
    return load_causal_lm(str(tiny_model_dir)).eval()


def test_shapes_and_prompt_layout(engine: HFEngine) -> None:
    reqs = requests(engine)
    batch = engine.generate(reqs, SamplingConfig(max_new_tokens=5))
    b, p = len(reqs), max(len(r.ids) for r in reqs)
    assert isinstance(batch, RolloutBatch) and len(batch) == b
    assert batch.prompt_ids_BP.shape == (b, p) and batch.prompt_mask_BP.shape == (b, p)
    assert batch.response_ids_BR.shape[0] == b and 1 <= batch.response_ids_BR.shape[1] <= 5
    assert batch.logprobs_BR.shape == batch.response_ids_BR.shape == batch.response_mask_BR.shape
    assert batch.group_B.tolist() == [r.group for r in reqs]
    assert batch.extras == [r.extras for r in reqs]
    for i, r in enumerate(reqs):  # left padding
        assert batch.prompt_ids_BP[i, p - len(r.ids) :].tolist() == r.ids
        assert batch.prompt_mask_BP[i].tolist() == [0] * (p - len(r.ids)) + [1] * len(r.ids)
    assert batch.logprobs_BR.dtype == torch.float32 and (batch.logprobs_BR <= 0).all()


def check_eos_masks(batch: RolloutBatch, eos: int, pad: int) -> None:
    for ids, mask, finish, logp in zip(batch.response_ids_BR, batch.response_mask_BR, batch.finish_B, batch.logprobs_BR):
        hits = (ids == eos).nonzero().flatten().tolist()
        n = hits[0] + 1 if hits else len(ids)
        assert mask.tolist() == [1] * n + [0] * (len(ids) - n)
        assert (ids[n:] == pad).all() and (logp[n:] == 0).all()
        assert finish.item() == (FINISH_STOP if hits else FINISH_LENGTH)
        if not hits:  # a LENGTH row has used every token
            assert n == len(ids)


def test_masks_stop_after_first_eos(eos_engine: HFEngine) -> None:
    tok = eos_engine.tokenizer
    torch.manual_seed(0)  # sampling draws from torch's global RNG
    batch = eos_engine.generate(requests(eos_engine, 3), SamplingConfig(max_new_tokens=6))
    finishes = set(batch.finish_B.tolist())
    assert finishes == {FINISH_STOP, FINISH_LENGTH}, "the EOS bias should give rows of both kinds"
    check_eos_masks(batch, tok.eos_token_id, tok.pad_token_id)
    assert batch.response_ids_BR.shape[1] == 6  # some row ran to the limit


def test_without_stop_at_eos_everything_is_length(eos_engine: HFEngine) -> None:
    batch = eos_engine.generate(requests(eos_engine), SamplingConfig(max_new_tokens=4, stop_at_eos=False))
    assert batch.response_mask_BR.shape[1] == 4 and (batch.response_mask_BR == 1).all()
    assert (batch.finish_B == FINISH_LENGTH).all()


def test_response_mask_hand_case() -> None:
    eos = 2
    mask, finish = _response_mask(torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 2, 5, 2], [5, 6, 7, 2]]), eos)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert finish.tolist() == [FINISH_STOP, FINISH_LENGTH, FINISH_STOP, FINISH_STOP]
    mask, finish = _response_mask(torch.tensor([[2, 2]]), None)
    assert mask.tolist() == [[1, 1]] and finish.tolist() == [FINISH_LENGTH]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_learner_recomputation(engine: HFEngine, learner_model: torch.nn.Module, temperature: float) -> None:
    torch.manual_seed(0)
    batch = engine.generate(requests(engine), SamplingConfig(max_new_tokens=6, temperature=temperature))
    with torch.no_grad():
        recomputed = response_logprobs(learner_model, batch, temperature)
    torch.testing.assert_close(recomputed, batch.logprobs_BR, atol=1e-5, rtol=0)
    assert batch.response_mask_BR.sum() > len(batch)  # not trivially short


def test_logprobs_match_with_early_stops(eos_engine: HFEngine) -> None:
    batch = eos_engine.generate(requests(eos_engine, 3), SamplingConfig(max_new_tokens=6))
    with torch.no_grad():
        recomputed = response_logprobs(eos_engine.model, batch, 1.0)
    torch.testing.assert_close(recomputed, batch.logprobs_BR, atol=1e-5, rtol=0)


def test_greedy_is_deterministic(engine: HFEngine, learner_model: torch.nn.Module) -> None:
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    torch.manual_seed(123)
    a = engine.generate(requests(engine, 1), greedy)
    torch.manual_seed(456)
    b = engine.generate(requests(engine, 1), greedy)
    assert torch.equal(a.response_ids_BR, b.response_ids_BR) and torch.equal(a.logprobs_BR, b.logprobs_BR)
    # Greedy tokens are the argmax of the learner's own distribution at every real position.
    with torch.no_grad():
        ids = torch.cat([a.prompt_ids_BP, a.response_ids_BR], 1)
        attn = torch.cat([a.prompt_mask_BP, a.response_mask_BR], 1)
        logits = learner_model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0)).logits
    p = a.prompt_ids_BP.shape[1]
    argmax = logits[:, p - 1 : -1].argmax(-1)
    real = a.response_mask_BR.bool()
    assert torch.equal(argmax[real], a.response_ids_BR[real])


def test_chunked_generation_matches_one_call(tiny_model_dir: Path, engine: HFEngine) -> None:
    chunked = ENGINES.build({"name": "hf", "max_batch_size": 3}, inject={"model_path": str(tiny_model_dir)})
    greedy = SamplingConfig(max_new_tokens=5, temperature=0.0)
    reqs = requests(engine, 1)
    a, b = engine.generate(reqs, greedy), chunked.generate(reqs, greedy)
    assert torch.equal(a.prompt_ids_BP, b.prompt_ids_BP) and a.group_B.tolist() == b.group_B.tolist()
    assert torch.equal(a.response_mask_BR, b.response_mask_BR)
    assert torch.equal(a.response_ids_BR * a.response_mask_BR, b.response_ids_BR * b.response_mask_BR)


def test_update_weights_loads_new_policy(tiny_model_dir: Path, learner_model: torch.nn.Module) -> None:
    eng = HFEngine(str(tiny_model_dir))
    state = {k: v + 0.01 for k, v in learner_model.state_dict().items()}
    copied = eng.update_weights(pack_state_dict(state, bucket_bytes=32 << 10))
    assert copied == sum(v.numel() * v.element_size() for v in state.values())
    got = eng.state_dict()
    assert all(torch.equal(got[k], v) for k, v in state.items())


def generate_with(engine: HFEngine, decode: str, reqs: list[PromptRequest], sampling: SamplingConfig,
                  seed: int) -> tuple[RolloutBatch, torch.Tensor]:
    """``engine.generate`` through one decode path from a seeded global RNG; also the RNG state it leaves."""
    engine.config = engine.config.model_copy(update={"decode": decode})
    try:
        torch.manual_seed(seed)
        return engine.generate(reqs, sampling), torch.get_rng_state()
    finally:
        engine.config = engine.config.model_copy(update={"decode": "lean"})


@pytest.mark.parametrize("sampling", [
    SamplingConfig(max_new_tokens=6, temperature=1.0),
    SamplingConfig(max_new_tokens=6, temperature=0.7, top_p=0.8),
    SamplingConfig(max_new_tokens=6, temperature=0.0),
    SamplingConfig(max_new_tokens=5, temperature=1.3, stop_at_eos=False),
], ids=["t1", "t0.7-top_p", "greedy", "no-eos"])
def test_lean_decode_samples_what_generate_samples(eos_engine: HFEngine, sampling: SamplingConfig) -> None:
    """Same seed, same tokens, log-probs and finish reasons, and the same RNG state after (exact resume), with
    rows stopping early (the EOS-biased model), so finished rows leave the lean batch mid-way."""
    reqs = requests(eos_engine, 3)
    lean, lean_rng = generate_with(eos_engine, "lean", reqs, sampling, seed=7)
    ref, ref_rng = generate_with(eos_engine, "generate", reqs, sampling, seed=7)
    assert torch.equal(lean.response_ids_BR, ref.response_ids_BR)
    assert torch.equal(lean.response_mask_BR, ref.response_mask_BR) and torch.equal(lean.finish_B, ref.finish_B)
    torch.testing.assert_close(lean.logprobs_BR, ref.logprobs_BR, atol=1e-5, rtol=0)
    assert torch.equal(lean_rng, ref_rng), "the lean loop must consume the global RNG as generate does"
    if sampling.stop_at_eos and sampling.temperature > 0:
        assert set(lean.finish_B.tolist()) == {FINISH_STOP, FINISH_LENGTH}, "rows should finish at different steps"


def test_lean_decode_needs_sdpa_or_eager_attention(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from toolbox.engines.decode import check_lean_attention

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), attn_implementation="eager")
    check_lean_attention(model)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="rollout.engine.decode=lean needs attention implementation sdpa or eager, "
                                         "the model uses 'flash_attention_2'"):
        check_lean_attention(model)


def test_lean_decode_with_eager_attention_matches_sdpa(engine: HFEngine, tiny_model_dir: Path) -> None:
    """The eager kernel takes the lean loop's additive mask: same tokens as sdpa's boolean one."""
    from transformers import AutoModelForCausalLM

    eager = HFEngine(str(tiny_model_dir))
    eager.model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), attn_implementation="eager").eval()
    sampling = SamplingConfig(max_new_tokens=6)
    reqs = requests(engine)
    a, _ = generate_with(engine, "lean", reqs, sampling, seed=3)
    b, _ = generate_with(eager, "lean", reqs, sampling, seed=3)
    assert torch.equal(a.response_ids_BR, b.response_ids_BR)
    torch.testing.assert_close(a.logprobs_BR, b.logprobs_BR, atol=1e-5, rtol=0)


def test_dropping_finished_rows_changes_nothing(eos_engine: HFEngine) -> None:
    """Finished rows leaving the batch (the default) or decoding padding: the same tokens and log-probs."""
    from toolbox.engines.decode import decode

    ids, mask = left_pad(requests(eos_engine, 3), eos_engine.tokenizer.pad_token_id)
    outs = []
    for drop in (True, False):
        torch.manual_seed(5)
        outs.append(decode(eos_engine.model, ids, mask, max_new_tokens=6, temperature=1.0, top_p=1.0,
                           eos=eos_engine.tokenizer.eos_token_id, pad=eos_engine.tokenizer.pad_token_id,
                           drop_finished=drop))
    (tok_a, logp_a), (tok_b, logp_b) = outs
    assert torch.equal(tok_a, tok_b)
    torch.testing.assert_close(logp_a, logp_b, atol=1e-5, rtol=0)
    assert (tok_a == eos_engine.tokenizer.eos_token_id).any(dim=1).sum() >= 2, "rows should stop early"


def test_own_forward_gives_the_transformers_logits(eos_engine: HFEngine) -> None:
    """`LlamaDecoder` against the model's forward over its static cache: the prompt's last logits and every step's,
    left padding included, with rows leaving the batch mid-way."""
    from toolbox.engines.decode import TransformersForward
    from toolbox.engines.llama_decode import LlamaDecoder, unsupported

    model = eos_engine.model
    assert unsupported(model) is None
    ids, mask = left_pad(requests(eos_engine, 2), eos_engine.tokenizer.pad_token_id)
    b, p = ids.shape
    assert (mask == 0).any(), "prompts of different lengths: some rows are left-padded"
    with torch.inference_mode():
        ours, theirs = LlamaDecoder(model, b, p + 4), TransformersForward(model, b, p + 4)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        torch.testing.assert_close(ours.prefill(ids, mask, pos), theirs.prefill(ids, mask, pos), atol=1e-5, rtol=1e-5)
        keys = torch.cat([mask.bool(), torch.zeros(b, 4, dtype=torch.bool)], 1)
        token, pos = ids[:, -1], pos[:, -1] + 1
        for t in range(4):
            if t == 2:  # rows 0 and 5 finish
                keep = torch.tensor([i for i in range(len(token)) if i not in (0, 5)])
                ours.keep(keep), theirs.keep(keep)
                token, pos, keys = token[keep], pos[keep], keys[keep]
            keys[:, p + t] = True
            a, c = ours.step(token, pos, keys), theirs.step(token, pos, keys)
            torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)
            token, pos = a.argmax(-1), pos + 1


def test_both_forwards_sample_the_same_tokens(eos_engine: HFEngine) -> None:
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    reqs = requests(eos_engine, 3)
    out = []
    for forward in ("auto", "transformers"):
        eos_engine.config = eos_engine.config.model_copy(update={"forward": forward})
        out.append(generate_with(eos_engine, "lean", reqs, sampling, seed=11)[0])
    eos_engine.config = eos_engine.config.model_copy(update={"forward": "auto"})
    assert torch.equal(out[0].response_ids_BR, out[1].response_ids_BR)
    torch.testing.assert_close(out[0].logprobs_BR, out[1].logprobs_BR, atol=1e-5, rtol=0)


@pytest.mark.parametrize("forward", ["auto", "transformers"])
def test_samples_of_one_prompt_share_its_prefill(eos_engine: HFEngine, forward: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Each prompt 3 times, interleaved: the prefill runs once per distinct prompt and its cache rows are copied; the
    tokens and log-probs are the ones of a prefill over every row."""
    import toolbox.engines.decode as decode_module

    prefills: list[int] = []
    real_forward_for = decode_module.forward_for

    def counting(*args: object) -> object:
        fwd = real_forward_for(*args)  # type: ignore[arg-type]
        prefill = fwd.prefill
        fwd.prefill = lambda ids, *rest: prefills.append(len(ids)) or prefill(ids, *rest)  # type: ignore[method-assign]
        return fwd

    monkeypatch.setattr(decode_module, "forward_for", counting)
    eos_engine.config = eos_engine.config.model_copy(update={"forward": forward})
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    reqs = [r for _ in range(3) for r in requests(eos_engine, 1)]
    try:
        shared = generate_with(eos_engine, "lean", reqs, sampling, seed=5)[0]
        monkeypatch.setattr(decode_module, "distinct_prompts",
                            lambda ids, mask: (torch.arange(len(ids)), torch.arange(len(ids))))
        alone = generate_with(eos_engine, "lean", reqs, sampling, seed=5)[0]
    finally:
        eos_engine.config = eos_engine.config.model_copy(update={"forward": "auto"})
    assert prefills == [len(PROMPTS), 3 * len(PROMPTS)]
    assert torch.equal(shared.response_ids_BR, alone.response_ids_BR)
    torch.testing.assert_close(shared.logprobs_BR, alone.logprobs_BR, atol=1e-5, rtol=0)


def test_models_the_own_forward_does_not_take(tiny_model_dir: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from toolbox.engines.llama_decode import unsupported

    model = load_causal_lm(str(tiny_model_dir))
    model.config.rope_parameters = {**model.config.rope_parameters, "rope_type": "yarn"}
    assert unsupported(model) == "RoPE type 'yarn'"
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16))
    assert "model type 'gpt2'" in str(unsupported(gpt2))


def test_weights_kept_column_major_change_no_value(tiny_model_dir: Path, learner_model: torch.nn.Module) -> None:
    """The own forward keeps the engine's projection weights column-major on a CPU (`column_major_weights`): the
    values and every reader stay as they were, and after a weight load re-points them the next call moves them back."""
    from toolbox.engines.llama_decode import column_major_weights

    eng = HFEngine(str(tiny_model_dir))
    q_proj = eng.model.model.layers[0].self_attn.q_proj
    assert q_proj.weight.is_contiguous()
    before = eng.state_dict()
    eng.generate(requests(eng, 1), SamplingConfig(max_new_tokens=2))
    assert q_proj.weight.stride() == (1, q_proj.weight.shape[0]) and column_major_weights(eng.model) == 0
    after = eng.state_dict()
    assert all(torch.equal(before[k], v) and v.is_contiguous() for k, v in after.items())
    state = {k: v + 0.01 for k, v in learner_model.state_dict().items()}
    eng.update_weights(pack_state_dict(state, bucket_bytes=32 << 10))
    assert all(torch.equal(eng.state_dict()[k], v) for k, v in state.items())
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    ours = eng.generate(requests(eng, 1), greedy)
    eng.config = eng.config.model_copy(update={"forward": "transformers"})
    theirs = eng.generate(requests(eng, 1), greedy)
    assert torch.equal(ours.response_ids_BR, theirs.response_ids_BR)
    torch.testing.assert_close(ours.logprobs_BR, theirs.logprobs_BR, atol=1e-5, rtol=0)


def test_looking_at_finished_rows_every_few_steps_changes_nothing(eos_engine: HFEngine,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU each look at which rows finished waits for the device; looking every 4 steps (dropping or masking)
    samples the same tokens, log-probs and response width as looking every step, with a quarter of the waits."""
    from toolbox.engines.decode import decode

    ids, mask = left_pad(requests(eos_engine, 3), eos_engine.tokenizer.pad_token_id)
    waits = [0]
    to_bool = torch.Tensor.__bool__

    def counted(t: torch.Tensor) -> bool:
        waits[0] += 1
        return to_bool(t)

    monkeypatch.setattr(torch.Tensor, "__bool__", counted)
    outs, looks = [], []
    for every, drop in ((1, True), (4, True), (4, False)):
        torch.manual_seed(5)
        waits[0] = 0
        outs.append(decode(eos_engine.model, ids, mask, max_new_tokens=12, temperature=1.0, top_p=1.0,
                           eos=eos_engine.tokenizer.eos_token_id, pad=eos_engine.tokenizer.pad_token_id,
                           drop_finished=drop, check_every=every))
        looks.append(waits[0])
    for tok, logp in outs[1:]:
        assert torch.equal(tok, outs[0][0])
        torch.testing.assert_close(logp, outs[0][1], atol=1e-5, rtol=0)
    assert looks[1] * 3 <= looks[0], looks
