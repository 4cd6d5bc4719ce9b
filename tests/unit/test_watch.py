"""The loop's end-of-run evaluation, early stopping with patience and the best checkpoint, on a scripted trainer
(`BaseTrainer` with real atomic checkpoints; no model, no Ray)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from toolbox.config import load_config
from toolbox.config.trainer import TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.core.events import Event, EventBus
from toolbox.trainers.base import BaseTrainer


class Scripted(BaseTrainer):
    """Step metric ``loss`` and eval metric ``score`` read from scripts; the learner's part is one file."""

    def __init__(self, cfg: TrainerConfig, run_dir: Path, losses: list[float], scores: list[float]) -> None:
        super().__init__(cfg, bus := EventBus())
        self.run_dir, self.losses, self.scores = run_dir, losses, scores
        self.events: list[tuple[str, int, dict[str, Any]]] = []
        for event in Event:
            bus.subscribe(event, lambda e, p: self.events.append((e.value, p.get("step", -1), p)))

    def train_step(self, step: int) -> dict[str, float]:
        return {"loss": self.losses[step]}

    def evaluate(self) -> dict[str, float]:
        return {"score": self.scores.pop(0)}

    def save(self, step: int) -> str:
        return self.save_checkpoint(self.run_dir, step, lambda path: (Path(path) / "w").write_text(str(step)) and path)

    def kinds(self) -> list[tuple[str, int]]:
        return [(k, s) for k, s, _ in self.events if k in ("eval_end", "checkpoint_saved")]


def test_a_final_evaluation_follows_the_last_checkpoint(tmp_path: Path) -> None:
    trainer = Scripted(TrainerConfig(total_steps=4, save_every=2, eval_every=0), tmp_path, [1.0] * 4, [0.7])
    summary = trainer.fit()
    assert trainer.kinds() == [("checkpoint_saved", 2), ("checkpoint_saved", 4), ("eval_end", 4)]
    assert summary["eval/score"] == 0.7 and summary["eval_step"] == 4
    assert [p.get("final") for k, _, p in trainer.events if k == "eval_end"] == [True]


def test_a_step_just_evaluated_is_not_evaluated_again(tmp_path: Path) -> None:
    trainer = Scripted(TrainerConfig(total_steps=4, save_every=0, eval_every=2), tmp_path, [1.0] * 4, [0.1, 0.2])
    trainer.fit()
    assert trainer.kinds() == [("eval_end", 2), ("eval_end", 4), ("checkpoint_saved", 4)]
    off = Scripted(TrainerConfig(total_steps=2, save_every=0, final_eval=False), tmp_path / "off", [1.0] * 2, [])
    off.fit()
    assert off.kinds() == [("checkpoint_saved", 2)]


def test_early_stop_waits_out_its_patience_then_saves(tmp_path: Path) -> None:
    losses = [5.0, 4.0, 3.0, 3.5, 3.2, 3.1, 1.0, 1.0]
    cfg = TrainerConfig(total_steps=8, save_every=0, final_eval=False,
                        early_stop={"metric": "loss", "mode": "min", "patience": 3})  # type: ignore[arg-type]
    trainer = Scripted(cfg, tmp_path, losses, [])
    summary = trainer.fit()
    assert summary["steps"] == 6  # best 3.0 at step 3; steps 4, 5, 6 did not beat it
    assert trainer.kinds() == [("checkpoint_saved", 6)]


def test_min_delta_counts_small_gains_as_none(tmp_path: Path) -> None:
    cfg = TrainerConfig(total_steps=6, save_every=0, eval_every=1, final_eval=False,
                        early_stop={"metric": "eval/score", "patience": 2, "min_delta": 0.05})  # type: ignore[arg-type]
    trainer = Scripted(cfg, tmp_path, [1.0] * 6, [0.5, 0.52, 0.54, 0.9, 0.9, 0.9])
    assert trainer.fit()["steps"] == 3


def test_the_best_checkpoint_survives_pruning(tmp_path: Path) -> None:
    cfg = TrainerConfig(total_steps=8, save_every=2, eval_every=2, keep_checkpoints=1,
                        keep_best={"metric": "eval/score"})  # type: ignore[arg-type]
    trainer = Scripted(cfg, tmp_path, [1.0] * 8, [0.2, 0.9, 0.4, 0.5])
    trainer.fit()
    best = tmp_path / "checkpoints" / "best"
    assert json.loads((best / "best.json").read_text()) == {"step": 4, "metric": "eval/score", "value": 0.9}
    assert (best / "w").read_text() == "4" and (best / "COMPLETE").is_file()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best", "step_8"]


def test_a_metric_the_run_does_not_have_is_named_with_those_it_has(tmp_path: Path) -> None:
    cfg = TrainerConfig(total_steps=2, early_stop={"metric": "reward"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"trainer.early_stop.metric='reward': the step metrics have no 'reward'; "
                                          r"they have \['loss', 'step_time_s'\]"):
        Scripted(cfg, tmp_path, [1.0, 1.0], []).fit()


def test_profile_steps_outside_the_run_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"trainer.profile_steps=\[0, 3\]: \[0\] outside the run's steps 1..3 "):
        load_config(["trainer.total_steps=3", "trainer.profile_steps=[0,3]"])


def test_an_eval_metric_needs_evaluations() -> None:
    with pytest.raises(ConfigError, match=r"trainer.keep_best.metric='eval/reward' is an evaluation's metric and "
                                          r"trainer.eval_every is 0"):
        load_config(["trainer.eval_every=0", "trainer.keep_best={metric: eval/reward}"])


def test_a_profiled_step_leaves_a_trace_per_learner_rank(tmp_path: Path) -> None:
    from toolbox.driver.experiment import ExperimentBuilder

    args = ["experiment=sft_tiny", "ray.local_mode=true", "learner.strategy=single", "learner.num_workers=1",
            "callbacks=[]", "trainer.eval_every=0", f"trainer.run_root={tmp_path}", "trainer.run_name=p",
            "trainer.total_steps=3", "trainer.profile_steps=[2]", "trainer.final_eval=false"]
    ExperimentBuilder(load_config(args)).build_trainer().fit()
    assert [p.name for p in (tmp_path / "p" / "profile").iterdir()] == ["step_2"]
    # named as torch's tensorboard_trace_handler names traces: TensorBoard's profiler plugin lists *.pt.trace.json
    trace = json.loads((tmp_path / "p" / "profile" / "step_2" / "rank_0.pt.trace.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("aten::") for n in names)  # the rank's torch operators were recorded
    assert "Optimizer.step#AdamW.step" in names


class Resumable(Scripted):
    """`Scripted` resumed from ``trainer.resume_from``: the learner's part is its step."""

    def prepare(self) -> int:
        return self.resume(lambda path: int(Path(path).name.removeprefix("step_")))


def test_a_resumed_run_keeps_its_best_checkpoint_and_its_patience(tmp_path: Path) -> None:
    best_cfg = {"total_steps": 6, "save_every": 2, "eval_every": 2, "keep_best": {"metric": "eval/score"}}
    Resumable(TrainerConfig(**best_cfg), tmp_path, [1.0] * 8, [0.2, 0.9, 0.4]).fit()  # type: ignore[arg-type]
    resumed = TrainerConfig(**{**best_cfg, "total_steps": 8,  # type: ignore[arg-type]
                               "resume_from": str(tmp_path / "checkpoints" / "step_6")})
    Resumable(resumed, tmp_path, [1.0] * 8, [0.5]).fit()  # 0.5 at step 8: not better than step 4's 0.9
    best = json.loads((tmp_path / "checkpoints" / "best" / "best.json").read_text())
    assert best == {"step": 4, "metric": "eval/score", "value": 0.9}
    losses, stop = [5.0, 4.0, 3.0, 3.5, 3.2, 3.1, 1.0, 1.0], {"metric": "loss", "mode": "min", "patience": 3}
    first = tmp_path / "stop"
    Resumable(TrainerConfig(total_steps=4, final_eval=False, early_stop=stop), first, losses, []).fit()  # type: ignore[arg-type]
    again = TrainerConfig(total_steps=8, final_eval=False, early_stop=stop,  # type: ignore[arg-type]
                          resume_from=str(first / "checkpoints" / "step_4"))
    assert Resumable(again, first, losses, []).fit()["steps"] == 6  # as uninterrupted: 3.0 at step 3, then 3 misses
