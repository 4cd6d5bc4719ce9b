"""The mixture-of-experts router loss (`toolbox.learner.router.RouterLoss`) on a tiny Qwen2MoE (and Mixtral): it is the
model's own ``aux_loss`` with its gradient, and every learner family (SFT, DPO, reward model, GRPO, PPO, online DPO) adds
``coef x`` it to what it back-propagates and reports it as ``moe_aux_loss``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.learner_steps import online_step
from toolbox.algorithms.dpo.config import DPOConfig
from toolbox.algorithms.dpo.learner import DPOLearner
from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.grpo.learner import GRPOLearner
from toolbox.algorithms.online_dpo.config import OnlineDPOConfig
from toolbox.algorithms.online_dpo.learner import OnlineDPOLearner
from toolbox.algorithms.ppo.config import PPOConfig
from toolbox.algorithms.ppo.learner import PPOLearner
from toolbox.algorithms.rm.config import RMConfig
from toolbox.algorithms.rm.learner import RMLearner
from toolbox.algorithms.sft.config import SFTConfig
from toolbox.algorithms.sft.learner import SFTLearner
from toolbox.learner.config import LearnerConfig
from toolbox.learner.router import RouterLoss
from toolbox.models.loading import load_causal_lm
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch

TASK = {"name": "digit_add", "max_operand": 9}
COEF = 0.5
GATE = "mlp.gate.weight"


def _gate_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for n, p in model.named_parameters() if n.endswith(GATE) and p.grad is not None])


def _tiny_mixtral() -> torch.nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    return MixtralForCausalLM(MixtralConfig(vocab_size=20, hidden_size=32, intermediate_size=64, num_local_experts=4,
                                            num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, max_position_embeddings=64))


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral"])
def test_router_loss_is_the_models_aux_loss_with_its_gradient(tiny_moe_dir: Path, arch: str) -> None:
    model = load_causal_lm(str(tiny_moe_dir), "float32") if arch == "qwen2_moe" else _tiny_mixtral()
    ids = torch.randint(3, 15, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # left padding: left out of the router statistics by the 2-D mask
    own = model(input_ids=ids, attention_mask=mask, output_router_logits=True).aux_loss
    (COEF * own).backward()
    want = _gate_grads(model).clone()
    model.zero_grad()
    router = RouterLoss(model, COEF)
    with torch.no_grad():  # a no-grad pass (old or reference log-probs) adds nothing
        model(input_ids=ids, attention_mask=mask)
    model(input_ids=ids, attention_mask=mask)
    added = router.add(torch.zeros(()))
    torch.testing.assert_close(added, COEF * own.detach())
    added.backward()
    torch.testing.assert_close(_gate_grads(model), want)
    assert router.metrics() == {"moe_aux_loss": pytest.approx(float(own.detach()))}
    assert router.metrics() == {}  # counted since the last call


def test_a_dense_model_is_refused_by_name(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"algorithm\.moe_aux_loss_coef=0\.1: Qwen2ForCausalLM is not a "
                                         r"mixture-of-experts model \(its config has no output_router_logits"):
        RouterLoss(load_causal_lm(str(tiny_model_dir), "float32"), 0.1)


def _rollout(rows: int = 4) -> tuple[list[RolloutBatch], list[RewardResult]]:
    gen = torch.Generator().manual_seed(0)
    batch = RolloutBatch(
        prompt_ids_BP=torch.randint(3, 15, (rows, 4), generator=gen), prompt_mask_BP=torch.ones(rows, 4, dtype=torch.long),
        response_ids_BR=torch.randint(3, 15, (rows, 3), generator=gen),
        response_mask_BR=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]]),
        logprobs_BR=torch.zeros(rows, 3), group_B=torch.arange(rows) // 2, finish_B=torch.zeros(rows, dtype=torch.long))
    return [batch], [RewardResult(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(rows, dtype=torch.long), [""] * rows)]


def _offline(cls: type, config: type, **algo: Any) -> Callable[[Path, float], tuple[Any, Callable[[], dict]]]:
    def build(path: Path, coef: float) -> tuple[Any, Callable[[], dict]]:
        cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=2)
        learner = cls(str(path), "float32", cfg, config(batch_size=4, max_length=16, moe_aux_loss_coef=coef, **algo),
                      total_steps=2, task=TASK, seed=0)
        return learner, lambda: learner.update(0)
    return build


def _online(cls: type, config: type, **algo: Any) -> Callable[[Path, float], tuple[Any, Callable[[], dict]]]:
    def build(path: Path, coef: float) -> tuple[Any, Callable[[], dict]]:
        cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=2, packing=False)
        learner = cls(str(path), "float32", cfg, config(prompts_per_step=2, group_size=2, moe_aux_loss_coef=coef, **algo),
                      total_steps=2)
        return learner, lambda: online_step(learner, *_rollout())
    return build


FAMILIES = {
    "sft": _offline(SFTLearner, SFTConfig, packing=False),
    "dpo": _offline(DPOLearner, DPOConfig),
    "rm": _offline(RMLearner, RMConfig),
    "grpo": _online(GRPOLearner, GRPOConfig),
    "ppo": _online(PPOLearner, PPOConfig),
    "online_dpo": _online(OnlineDPOLearner, OnlineDPOConfig),
}


def _step(build: Callable[[Path, float], tuple[Any, Callable[[], dict]]], path: Path,
          coef: float) -> tuple[dict[str, float], torch.Tensor]:
    """One update of a fresh learner (same seed, same weights) and the router gates' gradient it stepped on."""
    torch.manual_seed(0)
    learner, update = build(path, coef)
    grads: list[torch.Tensor] = []
    step = learner.policy.optimizer_step

    def capture() -> dict[str, float]:
        grads.append(_gate_grads(learner.policy.model).clone())
        return step()

    learner.policy.optimizer_step = capture
    return update(), grads[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_learner_adds_coef_times_the_router_loss(tiny_moe_dir: Path, family: str) -> None:
    build = FAMILIES[family]
    (off, grad_off), (on, grad_on) = _step(build, tiny_moe_dir, 0.0), _step(build, tiny_moe_dir, COEF)
    _, grad_twice = _step(build, tiny_moe_dir, 2 * COEF)
    assert "moe_aux_loss" not in off and on["moe_aux_loss"] > 0
    # the loss it back-propagates is the task loss + coef x the mean router loss of its training forwards
    assert on["loss"] == pytest.approx(off["loss"] + COEF * on["moe_aux_loss"], rel=1e-5, abs=1e-6)
    # the router term's gradient is in the step, linear in the coefficient
    delta = grad_on - grad_off
    assert delta.abs().max() > 1e-6
    torch.testing.assert_close(grad_twice - grad_off, 2 * delta, rtol=1e-3, atol=1e-6)
