"""DPOLearner numerics: step-0 values, micro-batch accumulation invariance, a loss-curve golden file, config errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.unit.golden import check_golden, run_recipe
from toolbox.algorithms.dpo.config import DPOConfig
from toolbox.algorithms.dpo.learner import DPOLearner, sequence_logps
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.data.offline import RecordSource
from toolbox.data.tasks import TASKS
from toolbox.learner.config import LearnerConfig, OptimConfig
from toolbox.objectives.registry import PREFERENCE_LOSSES


def make_learner(model_dir: Path, **algo: object) -> DPOLearner:
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=8, optim=OptimConfig(lr=1e-3))
    return DPOLearner(str(model_dir), "float32", cfg, DPOConfig(batch_size=8, max_length=16, **algo), total_steps=4,
                      task={"name": "digit_add", "max_operand": 9}, seed=0)


def test_generated_pairs_share_the_prompt_and_differ() -> None:
    source = RecordSource("preference", 0, task=TASKS.build({"name": "digit_add", "max_operand": 9}))
    for rec in source.step(0, 64):
        a, b = rec["prompt"].rstrip("=").split("+")
        assert rec["chosen"] == str(int(a) + int(b)) and rec["rejected"] != rec["chosen"]


def test_first_step_has_policy_equal_to_reference(tiny_model_dir: Path) -> None:
    learner = make_learner(tiny_model_dir)
    metrics = learner.accumulate(learner.train_data.step(0, 8), backward=False)
    assert metrics["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert metrics["margin"] == pytest.approx(0.0, abs=1e-6) and metrics["accuracy"] == 0.0


def test_ipo_uses_length_averaged_logps(tiny_model_dir: Path) -> None:
    learner = make_learner(tiny_model_dir, loss={"name": "ipo"})
    chosen, _ = learner.encode(learner.train_data.step(0, 1))[0]
    from toolbox.data.packing import pad_examples

    batch = pad_examples([chosen], 0)
    with torch.no_grad():
        total, mean = sequence_logps(learner.policy.model, batch), sequence_logps(learner.policy.model, batch, average=True)
    assert mean.item() == pytest.approx(total.item() / sum(chosen.loss_mask), rel=1e-6)
    assert learner.loss.length_average  # IPO declares it; the default sigmoid does not
    assert not PREFERENCE_LOSSES.build(DPOConfig().loss).length_average


@pytest.mark.parametrize("algo", [{"loss": {"name": "sigmoid", "label_smoothing": 0.1}}, {"loss": {"name": "ipo"}}])
def test_micro_batches_of_one_accumulate_to_the_full_batch_gradient(tiny_model_dir: Path, algo: dict) -> None:
    learner = make_learner(tiny_model_dir, **algo)
    # Move the policy off the reference first, so every loss type has a gradient.
    with torch.no_grad():
        for p in learner.policy.model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    records = learner.train_data.step(0, 8)
    grads, losses = [], []
    for micro in (8, 1):
        learner.cfg = learner.cfg.model_copy(update={"micro_batch_size": micro})
        losses.append(learner.accumulate(records, backward=True)["loss"])
        grads.append({n: p.grad.clone() for n, p in learner.policy.model.named_parameters() if p.grad is not None})
        learner.policy.optimizer.zero_grad(set_to_none=True)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-6, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_dpo_loss_curve_matches_golden(tmp_path: Path) -> None:
    history = run_recipe(tmp_path, "experiment=dpo_tiny", "trainer.total_steps=8")
    check_golden("dpo_tiny", history, ["loss", "accuracy", "margin", "grad_norm"])


@pytest.mark.parametrize(("override", "expected"), [
    ("algorithm.loss.name=sft", "algorithm.loss.name: 'sft' is a supervised loss; this algorithm takes a preference "
                                "loss: hinge, ipo, sigmoid"),
    ("algorithm.loss.name=ppo_clip", "'ppo_clip' is a policy loss; this algorithm takes a preference loss"),
    ("algorithm.loss.name=kto", "'kto' is not a registered loss of any family"),
    ("algorithm.batch_size=40", "each learner rank gets 20 preference pairs per step, which is not a multiple of "
                                "learner.micro_batch_size=8"),
])
def test_config_errors(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["experiment=dpo_tiny", override])
    assert expected in str(info.value)


def test_label_smoothing_is_for_sigmoid_only() -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.loss\.label_smoothing: Extra inputs are not permitted"):
        load_config(["experiment=dpo_tiny", "algorithm.loss.name=ipo", "algorithm.loss.label_smoothing=0.1"])
    loss = load_config(["experiment=dpo_tiny", "algorithm.loss.label_smoothing=0.1"]).algorithm.loss
    assert loss.model_dump() == {"name": "sigmoid", "label_smoothing": 0.1}
