"""The model seam: toolbox's from-scratch GPT (`toolbox.models.gpt`) behind `toolbox.models.causal_lm.MODELS`
loads, saves, decodes and trains through the same paths as a transformers model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.golden import run_recipe
from tests.unit.learner_steps import assert_same_update, online_step, spawn_two_gloo_ranks
from tests.unit.test_learner_forwards import ROWS, _batch, _grpo, _rewards
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.engines.decode import decode
from toolbox.learner.hf_export import export_state
from toolbox.models.causal_lm import DecodesItself, family_of
from toolbox.models.gpt import GPT, GPTConfig
from toolbox.models.loading import TinyModelConfig, load_causal_lm, load_tokenizer
from toolbox.models.logprobs import response_logprobs
from toolbox.models.tiny import ensure_tiny_model
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("gpt") / "tiny", TinyModelConfig(), "0123456789+=", "gpt")


def test_a_saved_gpt_declares_its_family_and_loads_back(gpt_dir: Path, tmp_path: Path) -> None:
    model = load_causal_lm(str(gpt_dir))
    assert isinstance(model, GPT) and isinstance(model, DecodesItself) and family_of(str(gpt_dir)) == "gpt"
    model.save_pretrained(tmp_path / "again")
    again = load_causal_lm(str(tmp_path / "again"), "bfloat16")
    assert again.dtype == torch.bfloat16
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        torch.testing.assert_close(a.to(torch.bfloat16), b, msg=name)
    assert len(load_tokenizer(str(gpt_dir))) == model.config.vocab_size


def test_export_writes_a_directory_that_loads_back(gpt_dir: Path, tmp_path: Path) -> None:
    """The learner's state dict through `export_state` (what ``toolbox export`` runs), then loaded as a policy."""
    trained = load_causal_lm(str(gpt_dir))
    with torch.no_grad():
        trained.lm_head.weight.add_(1.0)
    out = export_state(trained.state_dict(), str(gpt_dir), "float32", tmp_path / "export")
    back = load_causal_lm(str(out))
    torch.testing.assert_close(back.lm_head.weight, trained.lm_head.weight)
    assert len(load_tokenizer(str(out))) == back.config.vocab_size


def test_padding_and_packed_documents_do_not_change_a_rows_logits() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, hidden_size=16, num_heads=2, max_positions=16)).eval()
    a, b = torch.tensor([[3, 4, 5]]), torch.tensor([[6, 7]])
    alone_a, alone_b = model(a).logits, model(b).logits
    # Left padding (mask 0, positions counting real tokens only), as the engine and learner pad rollouts.
    padded = model(torch.tensor([[0, 0, 3, 4, 5]]), attention_mask=torch.tensor([[0, 0, 1, 1, 1]]),
                   position_ids=torch.tensor([[0, 0, 0, 1, 2]])).logits
    torch.testing.assert_close(padded[:, 2:], alone_a)
    # Two documents packed in one row: positions restart at the second, which must not see the first.
    packed = model(torch.tensor([[3, 4, 5, 6, 7]]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                   position_ids=torch.tensor([[0, 1, 2, 0, 1]])).logits
    torch.testing.assert_close(packed[:, :3], alone_a)
    torch.testing.assert_close(packed[:, 3:], alone_b)


def test_the_engines_decode_loop_samples_what_the_learner_scores(gpt_dir: Path) -> None:
    """Behaviour log-probs from the lean loop (the GPT's own KV cache) equal the learner's forward of the rows."""
    model = load_causal_lm(str(gpt_dir)).eval()
    prompt_ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12], [8, 9, 10, 11, 12]])
    prompt_mask = (torch.arange(5) >= torch.tensor([[2], [0], [0]])).long()
    torch.manual_seed(0)
    tokens, logp = decode(model, prompt_ids, prompt_mask, max_new_tokens=6, temperature=1.0, top_p=1.0, eos=None,
                          pad=0)
    rows = RolloutBatch(prompt_ids_BP=prompt_ids, prompt_mask_BP=prompt_mask, response_ids_BR=tokens,
                        response_mask_BR=torch.ones_like(tokens), logprobs_BR=logp,
                        group_B=torch.zeros(3, dtype=torch.long), finish_B=torch.zeros(3, dtype=torch.long))
    with torch.no_grad():
        learner_logp = response_logprobs(model, rows, temperature=1.0)
    torch.testing.assert_close(learner_logp, logp, atol=1e-5, rtol=1e-5)


def test_model_name_selects_a_registered_family() -> None:
    assert load_config(["experiment=grpo_tiny", "model.name=gpt"]).model.name == "gpt"
    with pytest.raises(ConfigError, match=r"model\.name: Value error, 'mamba' is not a registered model family; "
                                          r"allowed: \['gpt', 'hf'\]"):
        load_config(["experiment=grpo_tiny", "model.name=mamba"])


@pytest.mark.parametrize(("experiment", "key"), [("sft_tiny", "loss"), ("grpo_tiny", "pg_loss")])
def test_the_gpt_trains_through_the_same_learner_and_engine(experiment: str, key: str, tmp_path: Path) -> None:
    history = run_recipe(tmp_path, f"experiment={experiment}", "model.name=gpt", "trainer.total_steps=3",
                         "trainer.save_every=0")
    assert len(history) == 3 and all(step["grad_norm"] > 0 and key in step for step in history)
    run_models = list((tmp_path / ".models").glob("tiny-gpt-*"))
    assert len(run_models) == 1 and family_of(str(run_models[0])) == "gpt"
    if experiment == "sft_tiny":
        assert history[-1]["loss"] < history[0]["loss"]


def _fsdp2_rank(rank: int, model_dir: str, out: str) -> None:
    learner = _grpo(Path(model_dir), True, strategy="fsdp2", workers=2)
    shards, results = _batch(rows=2 * ROWS, shared=True).split(2), [_rewards(), _rewards()]
    plan = learner.plan(shards, results)
    metrics = learner.update(plan, {i: shards[i] for i in plan.shards_for(rank)})
    state = learner.policy.full_state_dict()
    if rank == 0:
        torch.save({"metrics": metrics, "state": state}, out)


def test_two_fsdp2_ranks_make_the_one_rank_update_on_the_gpt(gpt_dir: Path, tmp_path: Path) -> None:
    """FSDP2 shards the GPT's blocks (`layers`) and two gloo ranks make the update one rank makes."""
    out = tmp_path / "ranks.pt"
    spawn_two_gloo_ranks(_fsdp2_rank, gpt_dir, out)
    two = torch.load(out)
    one = _grpo(gpt_dir, packing=False)
    metrics = online_step(one, [_batch(rows=2 * ROWS, shared=True)], [RewardResult.concat([_rewards(), _rewards()])])
    assert two["metrics"]["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-4, abs=1e-6)
    assert_same_update(two["state"], one.policy.full_state_dict())
