"""SFTLearner numerics: micro-batch accumulation invariance, a loss-curve golden file, config errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.golden import check_golden, run_recipe
from toolbox.algorithms.sft.config import SFTConfig
from toolbox.algorithms.sft.learner import SFTLearner
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.data.rows import DataConfig
from toolbox.driver.experiment import ExperimentBuilder
from toolbox.learner.config import LearnerConfig, OptimConfig


def make_learner(model_dir: Path, **algo: object) -> SFTLearner:
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=8, optim=OptimConfig(lr=1e-3))
    return SFTLearner(str(model_dir), "float32", cfg, SFTConfig(batch_size=8, max_length=16, **algo), total_steps=4,
                      task={"name": "digit_add", "max_operand": 9}, seed=0)


def grads_with_micro_batch(learner: SFTLearner, micro: int) -> tuple[dict[str, torch.Tensor], float]:
    learner.cfg = learner.cfg.model_copy(update={"micro_batch_size": micro})
    learner.policy.optimizer.zero_grad(set_to_none=True)
    metrics = learner.accumulate(learner.train_data.step(0, 8), backward=True)
    grads = {n: p.grad.clone() for n, p in learner.policy.model.named_parameters() if p.grad is not None}
    learner.policy.optimizer.zero_grad(set_to_none=True)
    return grads, metrics["loss"]


@pytest.mark.parametrize(("packing", "loss"), [(False, "sft"), (True, "sft"), (False, "seq"), (True, "seq")])
def test_micro_batches_of_one_accumulate_to_the_full_batch_gradient(tiny_model_dir: Path, packing: bool,
                                                                    loss: str) -> None:
    learner = make_learner(tiny_model_dir, packing=packing, loss={"name": loss})
    one_by_eight, loss_a = grads_with_micro_batch(learner, 8)
    eight_by_one, loss_b = grads_with_micro_batch(learner, 1)
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    assert one_by_eight.keys() == eight_by_one.keys() and one_by_eight
    for name, g in one_by_eight.items():
        torch.testing.assert_close(eight_by_one[name], g, atol=1e-6, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_packing_changes_layout_not_loss(tiny_model_dir: Path) -> None:
    packed = make_learner(tiny_model_dir, packing=True)
    padded = make_learner(tiny_model_dir, packing=False)
    records = packed.train_data.step(3, 8)
    with torch.no_grad():
        a, b = packed.accumulate(records, backward=False), padded.accumulate(records, backward=False)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["tokens"] == b["tokens"]
    assert len(packed.collate(records)) < len(padded.collate(records)) == 8


def test_sft_loss_curve_matches_golden(tmp_path: Path) -> None:
    history = run_recipe(tmp_path, "experiment=sft_tiny", "trainer.total_steps=8")
    losses = [m["loss"] for m in history]
    assert losses[-1] < losses[0]
    check_golden("sft_tiny", history, ["loss", "grad_norm"])


def test_resume_reproduces_the_uninterrupted_curve(tmp_path: Path) -> None:
    base = ["experiment=sft_tiny", "ray.local_mode=true", "learner.strategy=single", "learner.num_workers=1",
            "callbacks=[]", "trainer.eval_every=0", f"trainer.run_root={tmp_path}", "trainer.total_steps=4"]
    first = ExperimentBuilder(load_config([*base, "trainer.save_every=2"])).build_trainer()
    first.fit()
    step_2 = first.run_dir / "checkpoints" / "step_2"
    resumed = ExperimentBuilder(load_config([*base, f"trainer.resume_from={step_2}"])).build_trainer()
    resumed.fit()
    assert [m["loss"] for m in resumed.history] == pytest.approx([m["loss"] for m in first.history[2:]], rel=1e-6)


def test_evaluate_reports_held_out_loss_without_training(tiny_model_dir: Path) -> None:
    learner = make_learner(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in learner.policy.model.named_parameters()}
    metrics = learner.evaluate()
    assert metrics["loss"] > 0 and metrics["documents"] == 64
    assert all(torch.equal(before[n], p) for n, p in learner.policy.model.named_parameters())


@pytest.mark.parametrize(("override", "expected"), [
    ("algorithm.loss.name=sigmoid", "algorithm.loss.name: 'sigmoid' is a preference loss; this algorithm takes a "
                                    "supervised loss: seq, sft"),
    ("algorithm.loss.name=ppo_clip", "algorithm.loss.name: 'ppo_clip' is a policy loss; this algorithm takes a "
                                     "supervised loss"),
    ("algorithm.batch_size=63", "algorithm.batch_size=63 examples do not split over learner.num_workers=2"),
])
def test_config_errors_name_both_sides(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["experiment=sft_tiny", override])
    assert expected in str(info.value)
    assert "algorithm" in str(info.value)


def test_unpacked_batches_must_split_into_micro_batches() -> None:
    with pytest.raises(ConfigError, match="learner.micro_batch_size=5"):
        load_config(["experiment=sft_tiny", "algorithm.packing=false", "learner.micro_batch_size=5"])
    load_config(["experiment=sft_tiny", "learner.micro_batch_size=5"])  # packed rows: any micro-batch size


def test_dataset_file_errors_fail_at_config_time(tmp_path: Path) -> None:
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"prompt": "1+1=", "response": "2"}\n{"prompt": "1+2="}\n')
    with pytest.raises(ConfigError) as info:
        load_config(["experiment=sft_tiny", f"algorithm.dataset={bad}"])
    assert f"algorithm.dataset: {bad}:2: field 'response'" in str(info.value)


def test_trains_from_a_jsonl_file(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"prompt": "{a}+{a}=", "response": "{2 * a}"}}\n' for a in range(5)))
    history = run_recipe(tmp_path, "experiment=sft_tiny", f"algorithm.dataset={data}", "trainer.total_steps=3",
                         "algorithm.batch_size=8")
    assert len(history) == 3 and all(m["documents"] == 8 for m in history)


def test_a_prompt_that_fills_max_length_is_a_bad_row(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Cutting it would leave no answer token: not silently learned from, but named by file:row (or skipped)."""
    data = tmp_path / "train.jsonl"
    long_prompt = "1+" * 10 + "1="
    data.write_text('{"prompt": "1+1=", "response": "2"}\n' + f'{{"prompt": "{long_prompt}", "response": "11"}}\n')
    with pytest.raises(ConfigError, match=rf"{data}:2: the prompt is \d+ tokens, so nothing of the answer fits in "
                                          r"max_length=16"):
        make_learner(tiny_model_dir, dataset=str(data))
    algo = SFTConfig(batch_size=8, max_length=16, dataset=str(data))
    algo.check_rows(DataConfig(on_bad_row="skip"))  # what the experiment's `data` section hands over
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=8)
    learner = SFTLearner(str(tiny_model_dir), "float32", cfg, algo, total_steps=1, task={"name": "digit_add"}, seed=0)
    assert learner.train_data.records == [{"prompt": "1+1=", "response": "2"}]
