"""Atomic checkpoints (staged, marked COMPLETE, renamed, pruned), what a resume picks, the non-finite step guard
and the schedule's planned length. No Ray, no model beyond a few linear layers."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import pytest
import torch
from torch import nn

from toolbox.config import load_config
from toolbox.config.trainer import TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.core.events import EventBus
from toolbox.learner.config import OptimConfig
from toolbox.learner.optim import NonFiniteStepsError, TrainedModel
from toolbox.trainers.base import BaseTrainer
from toolbox.trainers.checkpoints import (
    COMPLETE,
    begin,
    commit,
    complete_checkpoints,
    latest_checkpoint,
    prune,
    resolve_resume,
    resume_command,
)


def complete(run_dir: Path, step: int) -> Path:
    final = run_dir / "checkpoints" / f"step_{step}"
    (begin(final) / "part").write_text(str(step))
    return commit(final.with_name(final.name + ".tmp"), final, {"step": step})


def test_a_partial_checkpoint_is_never_chosen(tmp_path: Path) -> None:
    complete(tmp_path, 10)
    begin(tmp_path / "checkpoints" / "step_20")  # killed while writing step 20
    (tmp_path / "checkpoints" / "step_30").mkdir()  # shards without the marker (copied half-way, older layout)
    (tmp_path / "checkpoints" / "step_30" / ".metadata").touch()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_10"
    assert resolve_resume(str(tmp_path), tmp_path) == str(tmp_path / "checkpoints" / "step_10")
    assert resolve_resume("auto", tmp_path) == str(tmp_path / "checkpoints" / "step_10")
    with pytest.raises(ConfigError, match=r"step_30: not a complete checkpoint .*the newest complete one is .*step_10"):
        resolve_resume(str(tmp_path / "checkpoints" / "step_30"), tmp_path)
    with pytest.raises(ConfigError, match=r"step_20.tmp: not a complete checkpoint"):
        resolve_resume(str(tmp_path / "checkpoints" / "step_20.tmp"), tmp_path)


def test_resume_targets_without_a_checkpoint(tmp_path: Path) -> None:
    assert resolve_resume("", tmp_path) == "" and resolve_resume("auto", tmp_path) == ""  # auto: a fresh start
    (tmp_path / "config.yaml").touch()
    with pytest.raises(ConfigError, match=r"trainer.resume_from=.*: the run directory has no complete checkpoint"):
        resolve_resume(str(tmp_path), tmp_path)
    with pytest.raises(ConfigError, match=r"trainer.resume_from=.*nowhere: does not exist"):
        resolve_resume(str(tmp_path / "nowhere"), tmp_path)
    with pytest.raises(ConfigError, match=r"trainer.resume_from=auto needs trainer.run_name"):
        load_config(["trainer.resume_from=auto"])


def test_commit_replaces_the_same_step_and_prune_keeps_the_newest(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        complete(tmp_path, step)
    again = complete(tmp_path, 8)  # a run resumed at its last step saves it again
    assert (again / "part").read_text() == "8" and (again / COMPLETE).is_file()
    begin(tmp_path / "checkpoints" / "step_3")  # a stale staging directory older than the newest complete one
    begin(tmp_path / "checkpoints" / "step_9")  # the one being written now: not touched
    prune(tmp_path, keep=2)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_6", "step_8"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_6", "step_8", "step_9.tmp"]
    prune(tmp_path, keep=0)  # 0 keeps all
    assert len(complete_checkpoints(tmp_path)) == 2


class Trainer(BaseTrainer):
    """A driver loop whose learner writes one file per save, and fails on demand."""

    def __init__(self, run_dir: Path, fail_at: int | None = None, **cfg: int) -> None:
        super().__init__(TrainerConfig(**cfg), EventBus())
        self.run_dir, self.fail_at, self.seen = run_dir, fail_at, 0

    def train_step(self, step: int) -> dict[str, float]:
        self.seen += 1
        return {"loss": float(step)}

    def save(self, step: int) -> str:
        return self.save_checkpoint(self.run_dir, step, self.save_learner)

    def save_learner(self, path: str) -> str:
        if self.step == self.fail_at:
            raise RuntimeError("killed while saving")
        (Path(path) / "learner").write_text(str(self.step))
        return path

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen = state["seen"]


def test_a_save_that_dies_leaves_the_previous_checkpoint_to_resume(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="killed while saving"):
        Trainer(tmp_path, fail_at=4, total_steps=6, save_every=2).fit()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_2"]
    assert (tmp_path / "checkpoints" / "step_4.tmp").is_dir()
    resumed = Trainer(tmp_path, total_steps=6, save_every=2, resume_from=resolve_resume("auto", tmp_path))
    summary = resumed.resume(lambda path: int((Path(path) / "learner").read_text()))
    assert summary == 2 and resumed.seen == 2  # the driver's own state came back too
    resumed.cfg = resumed.cfg.model_copy(update={"resume_from": str(tmp_path / "checkpoints" / "step_2")})
    resumed.load_state_dict({"seen": 0})
    assert resumed.fit()["steps"] == 6 and resumed.seen == 6
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_4", "step_6"]
    assert not (tmp_path / "checkpoints" / "step_4.tmp").exists()


def test_resume_command_only_with_a_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "my run"
    (run_dir / "checkpoints").mkdir(parents=True)
    assert resume_command(run_dir) is None
    complete(run_dir, 2)
    command = resume_command(run_dir)
    assert command is not None
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "toolbox.run"]
    assert args[3:] == [f"experiment={run_dir / 'config.yaml'}", f"trainer.run_root={tmp_path}",
                        "trainer.run_name=my run", "trainer.resume_from=auto"]


def linear_model() -> TrainedModel:
    torch.manual_seed(0)
    return TrainedModel(nn.Linear(3, 2), OptimConfig(lr=0.1, scheduler="cosine"), 10, max_bad_steps=3, name="policy")


def backward(model: TrainedModel, scale: float = 1.0) -> None:
    (model.module(torch.ones(1, 3)).sum() * scale).backward()


def test_non_finite_steps_are_skipped_counted_and_fail_after_max_in_a_row() -> None:
    model = linear_model()
    backward(model)
    assert model.step()["skipped"] == 0.0
    weights = {k: v.clone() for k, v in model.module.state_dict().items()}
    moments = {k: v.clone() for k, v in model.optimizer.state_dict()["state"][0].items()}
    for bad in (math.nan, math.inf):
        backward(model, bad)
        stats = model.step()
        assert stats["skipped"] == 1.0 and not math.isfinite(stats["grad_norm"])
    assert stats["bad_steps"] == 2.0 and model.scheduler.last_epoch == 3  # the schedule spent the skipped slots
    assert all(torch.equal(weights[k], v) for k, v in model.module.state_dict().items()), "a bad step moved weights"
    assert all(torch.equal(moments[k], v) for k, v in model.optimizer.state_dict()["state"][0].items())
    assert all(p.grad is None for p in model.module.parameters())
    backward(model)
    assert model.step()["skipped"] == 0.0  # a good step resets the count in a row (not the run's total)
    for _ in range(2):
        backward(model, math.nan)
        model.step()
    backward(model, math.nan)
    with pytest.raises(NonFiniteStepsError, match=r"policy: 3 optimizer steps in a row had a non-finite gradient "
                                                  r"norm .*learner.max_bad_steps=3"):
        model.step()
    assert model.bad_steps == 5


def lrs(model: TrainedModel, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        backward(model)
        out.append(model.step()["lr"])
    return out


def test_schedule_resumes_exactly_or_replans_a_longer_run(tmp_path: Path) -> None:
    whole = linear_model()
    uninterrupted = lrs(whole, 10)
    first = linear_model()
    assert lrs(first, 4) == uninterrupted[:4]
    first.save(tmp_path / "ckpt", {"step": 4})
    same = linear_model()
    assert same.load(tmp_path / "ckpt") == {"step": 4}
    assert lrs(same, 6) == uninterrupted[4:]  # the same plan continues bit for bit
    assert uninterrupted[-1] < 0.003  # cosine over 10 steps ends near 0 ...
    done = linear_model()
    lrs(done, 10)
    done.save(tmp_path / "end", {"step": 10})
    longer = TrainedModel(nn.Linear(3, 2), OptimConfig(lr=0.1, scheduler="cosine"), 20)
    longer.load(tmp_path / "end")
    # ... and a run raised to 20 steps continues on the 20-step plan from step 10 (half way: lr/2), not at 0.
    assert lrs(longer, 1) == [pytest.approx(0.05)]


def test_a_failed_run_prints_the_resume_command_only_when_it_can_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from toolbox.commands.run import main
    from toolbox.core.errors import WorkerError
    from toolbox.driver.experiment import ExperimentBuilder

    class Failing:
        def fit(self) -> None:
            raise WorkerError("learner", 1, "local", "update raised: RuntimeError: boom")

    monkeypatch.setattr(ExperimentBuilder, "build_trainer", lambda self: Failing())
    args = ["ray.local_mode=true", "learner.strategy=single", "learner.num_workers=1", f"trainer.run_root={tmp_path}",
            "trainer.run_name=r"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "learner rank 1 on node local: update raised" in err and "no complete checkpoint to resume from" in err
    assert "resume_from" not in err
    complete(tmp_path / "r", 10)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"resume it with: {resume_command(tmp_path / 'r')}" in err
