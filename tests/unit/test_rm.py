"""Reward-model training (``algorithm.name=rm``): the Bradley-Terry loss by hand, a short run of the rm_tiny recipe
in-process whose export loads as AutoModelForSequenceClassification and scores like the learner, config errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.unit.golden import run_recipe
from toolbox.algorithms.rm.config import RMConfig
from toolbox.algorithms.rm.learner import RMLearner
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.data.packing import pad_examples
from toolbox.learner.config import LearnerConfig, OptimConfig
from toolbox.models.reward_head import load_reward_model, sequence_scores
from toolbox.objectives.reward_model import bradley_terry_loss


def make_learner(model_dir: Path, **algo: object) -> RMLearner:
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=4, optim=OptimConfig(lr=1e-3))
    return RMLearner(str(model_dir), "float32", cfg, RMConfig(batch_size=8, max_length=16, **algo), total_steps=4,
                     task={"name": "digit_add", "max_operand": 9}, seed=0)


def test_bradley_terry_loss_by_hand() -> None:
    c, r = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 1.0])
    torch.testing.assert_close(bradley_terry_loss(c, r), torch.tensor([
        -torch.log(torch.sigmoid(torch.tensor(2.0))), torch.log(torch.tensor(2.0)),
        -torch.log(torch.sigmoid(torch.tensor(-2.0)))]))
    torch.testing.assert_close(bradley_terry_loss(c, r, 0.5), bradley_terry_loss(c, r) + 0.5 * (c + r) ** 2)


def test_learner_metrics_are_the_pairs_scores(tiny_model_dir: Path) -> None:
    learner = make_learner(tiny_model_dir, center_rewards_coef=0.1)
    records = learner.train_data.step(0, 8)
    metrics = learner.accumulate(records, backward=False)
    chosen, rejected = zip(*learner.encode(records))
    with torch.no_grad():
        s = sequence_scores(learner.policy.model, pad_examples(list(chosen) + list(rejected), 0))
    c, r = s[:8], s[8:]
    want = (-F.logsigmoid(c - r) + 0.1 * (c + r) ** 2).mean()
    assert metrics["loss"] == pytest.approx(float(want), rel=1e-5)
    assert metrics["accuracy"] == pytest.approx(float((c > r).float().mean()))
    assert metrics["margin"] == pytest.approx(float((c - r).mean()), rel=1e-5, abs=1e-6)
    assert learner.policy.ref is None  # a reward model needs no reference


def test_rm_tiny_learns_and_exports_a_sequence_classifier(tmp_path: Path) -> None:
    history = run_recipe(tmp_path, "experiment=rm_tiny", "trainer.total_steps=30", "trainer.run_name=rm")
    first, last = history[:5], history[-5:]
    mean = lambda rows, k: sum(m[k] for m in rows) / len(rows)  # noqa: E731
    assert mean(last, "loss") < mean(first, "loss") - 0.1, [m["loss"] for m in history]
    assert mean(last, "accuracy") > mean(first, "accuracy") + 0.1
    from transformers import AutoModelForSequenceClassification

    hf = tmp_path / "rm" / "hf"
    loaded = AutoModelForSequenceClassification.from_pretrained(str(hf)).eval()
    assert loaded.config.num_labels == 1 and loaded.config.pad_token_id is not None
    torch.testing.assert_close(loaded.score.weight, load_reward_model(str(hf)).score.weight)  # the trained head


@pytest.mark.parametrize(("override", "expected"), [
    ("algorithm.batch_size=40", "each learner rank gets 20 preference pairs per step, which is not a multiple of "
                                "learner.micro_batch_size=8"),
    ("learner.lora={r: 4}", "learner.lora: algorithm 'rm' trains the whole model"),
    ("algorithm.beta=0.1", "algorithm.beta"),
])
def test_config_errors(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["experiment=rm_tiny", override])
    assert expected in str(info.value)
