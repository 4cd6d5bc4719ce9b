"""LoRA (`toolbox.learner.lora`) on the tiny model: only adapters train, merged weights equal base + (alpha/r) B A
(and peft's own merge), the reference is the base model (adapters disabled), export writes adapter + merged model,
and 2 real FSDP2 ranks (gloo) reach the same merged weights as one rank."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tests.unit.learner_steps import spawn_two_gloo_ranks
from toolbox.learner.config import LearnerConfig
from toolbox.learner.lora import merged_state_dict
from toolbox.learner.policy import PolicyRank
from toolbox.models.loading import load_causal_lm
from toolbox.models.logprobs import response_logprobs
from toolbox.rl.batch import RolloutBatch

pytest.importorskip("peft")
LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
STEPS = 3


def _rows(vocab: int, rows: int = 4) -> RolloutBatch:
    gen = torch.Generator().manual_seed(7)
    return RolloutBatch(
        prompt_ids_BP=torch.randint(3, vocab, (rows, 5), generator=gen),
        prompt_mask_BP=torch.ones(rows, 5, dtype=torch.long),
        response_ids_BR=torch.randint(3, vocab, (rows, 6), generator=gen),
        response_mask_BR=torch.ones(rows, 6, dtype=torch.long),
        logprobs_BR=torch.zeros(rows, 6),
        group_B=torch.arange(rows),
        finish_B=torch.zeros(rows, dtype=torch.long),
    )


def _train(model_dir: str, strategy: str, workers: int) -> PolicyRank:
    cfg = LearnerConfig(num_workers=workers, strategy=strategy, device="cpu", lora=LORA,
                        optim={"lr": 1e-2, "scheduler": "constant"})
    torch.manual_seed(0)
    policy = PolicyRank.pretrained(model_dir, "float32", cfg, STEPS, frozen_reference=True)
    batch = _rows(policy.model.config.vocab_size)
    for _ in range(STEPS):
        logp_BR = response_logprobs(policy.model, batch, 1.0)
        (-(logp_BR.mean())).backward()
        policy.optimizer_step()
    return policy


def _logits(model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=batch.prompt_ids_BP).logits


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path) -> PolicyRank:
    return _train(str(tiny_model_dir), "single", 1)


def test_only_adapter_weights_train_and_are_optimized(trained: PolicyRank, tiny_model_dir: Path) -> None:
    base = load_causal_lm(str(tiny_model_dir)).state_dict()
    merged = merged_state_dict(trained.full_state_dict(), trained.cfg.lora)  # type: ignore[arg-type]
    assert sorted(merged) == sorted(base)  # engines get the base model's own names
    state = trained.full_state_dict()
    frozen = {k: v for k, v in state.items() if "lora_" not in k}
    for key, value in frozen.items():
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        assert torch.equal(value, base[name]), f"{key}: a base weight changed"
    lora_b = [v for k, v in state.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b), "the adapters (B starts at 0) did not train"
    optimized = {id(p) for g in trained.optimizer.param_groups for p in g["params"]}
    named = dict(trained.model.named_parameters())
    assert optimized == {id(p) for k, p in named.items() if "lora_" in k}


def test_merged_weights_are_base_plus_delta_and_match_peft(trained: PolicyRank, tiny_model_dir: Path) -> None:
    state, cfg = trained.full_state_dict(), trained.cfg.lora
    assert cfg is not None
    merged = merged_state_dict(state, cfg)
    base = load_causal_lm(str(tiny_model_dir)).state_dict()
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    a, b = state[f"{prefix}.lora_A.default.weight"], state[f"{prefix}.lora_B.default.weight"]
    expected = base["model.layers.0.self_attn.q_proj.weight"] + cfg.alpha / cfg.r * b @ a
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], expected)
    peft_merged = copy.deepcopy(trained.model).merge_and_unload().state_dict()  # type: ignore[operator]
    for name, value in peft_merged.items():
        torch.testing.assert_close(merged[name], value, rtol=0, atol=1e-6, msg=name)
    # Computing the merge left the trained module un-merged: its weights still differ from the merged ones.
    assert not torch.equal(trained.model.state_dict()[f"{prefix}.base_layer.weight"],
                           merged["model.layers.0.self_attn.q_proj.weight"])


def test_reference_is_the_base_model_with_adapters_disabled(trained: PolicyRank, tiny_model_dir: Path) -> None:
    assert trained.ref is not None and not list(trained.ref.parameters()), "the reference holds a second copy"
    batch = _rows(trained.model.config.vocab_size)
    base = load_causal_lm(str(tiny_model_dir)).eval()
    trained.model.eval()
    torch.testing.assert_close(_logits(trained.ref, batch), _logits(base, batch))
    assert not torch.allclose(_logits(trained.model, batch), _logits(base, batch))  # the adapters are back on


def test_export_writes_adapter_and_merged_model(trained: PolicyRank, tmp_path: Path) -> None:
    from peft import PeftModel

    out = Path(trained.export_hf(tmp_path / "hf"))
    assert (out / "adapter" / "adapter_config.json").exists() and (out / "config.json").exists()
    batch = _rows(trained.model.config.vocab_size)
    trained.model.eval()
    want = _logits(trained.model, batch)
    torch.testing.assert_close(_logits(load_causal_lm(str(out)).eval(), batch), want, rtol=1e-4, atol=1e-4)
    adapter = PeftModel.from_pretrained(load_causal_lm(trained.source), str(out / "adapter")).eval()
    torch.testing.assert_close(_logits(adapter, batch), want, rtol=1e-4, atol=1e-4)


def test_lora_config_errors(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"learner.lora.target_modules=\['no_such_proj'\]"):
        PolicyRank.pretrained(str(tiny_model_dir), "float32",
                              LearnerConfig(num_workers=1, strategy="single", lora={"target_modules": ["no_such_proj"]}),
                              1)
    with pytest.raises(ValueError, match="lora.rank"):
        LearnerConfig(lora={"rank": 4})


def _fsdp_rank(rank: int, model_dir: str, out: str) -> None:
    policy = _train(model_dir, "fsdp2", 2)
    batch = _rows(policy.model.config.vocab_size)
    ref_logits = _logits(policy.ref, batch)  # type: ignore[arg-type]
    buckets = policy.export_weights()  # rank 0: the merged weights engines receive
    if rank == 0:
        from toolbox.rl.weights import unpack_all

        torch.save({"merged": unpack_all(buckets), "ref_logits": ref_logits}, out)


def test_fsdp2_two_ranks_match_one_rank(trained: PolicyRank, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fsdp.pt"
    spawn_two_gloo_ranks(_fsdp_rank, tiny_model_dir, out)
    got = torch.load(out)
    want = merged_state_dict(trained.full_state_dict(), trained.cfg.lora)  # type: ignore[arg-type]
    assert sorted(got["merged"]) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got["merged"][name], value, rtol=1e-4, atol=1e-5, msg=name)
    base = load_causal_lm(str(tiny_model_dir)).eval()
    torch.testing.assert_close(got["ref_logits"], _logits(base, _rows(base.config.vocab_size)))


def test_checkpoint_of_a_lora_policy_exports_like_the_live_one(trained: PolicyRank, tmp_path: Path) -> None:
    from toolbox.learner.checkpoint import load_model_weights
    from toolbox.learner.hf_export import base_model
    from toolbox.learner.lora import add_adapters, write_lora

    assert trained.cfg.lora is not None
    ckpt = trained.save(tmp_path / "step_3")  # what `toolbox export` reads back
    model = add_adapters(base_model(trained.source), trained.cfg.lora)
    load_model_weights(ckpt, model)
    out = write_lora(model, trained.source, trained.cfg.lora, tmp_path / "hf")
    batch = _rows(trained.model.config.vocab_size)
    trained.model.eval()
    torch.testing.assert_close(_logits(load_causal_lm(str(out)).eval(), batch), _logits(trained.model, batch),
                               rtol=1e-4, atol=1e-4)


def test_grpo_with_lora_syncs_merged_weights_to_the_engine(tmp_path: Path) -> None:
    """A short in-process GRPO run (KL to the adapters-off reference, weight sync to the hf engine) with LoRA."""
    from tests.unit.golden import run_recipe

    history = run_recipe(tmp_path, "experiment=grpo_tiny", "trainer.total_steps=2", "learner.lora={r: 4}")
    assert len(history) == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in history)
    assert history[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy == reference (B starts at 0)
