"""Models out: a learner's policy and a DCP checkpoint as Hugging Face directories whose logits equal the learner's.

In-process, one rank. Two learner ranks (FSDP2 shards, on Ray) are in
``tests/integration/test_export_eval_ray.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.unit.test_trainer import FakeLearner, make_trainer
from toolbox.commands.export import export_checkpoint, find_source, main
from toolbox.config import load_config
from toolbox.config.loader import dump_config
from toolbox.config.trainer import TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.core.events import EventBus
from toolbox.learner.config import LearnerConfig
from toolbox.learner.policy import PolicyRank
from toolbox.models.loading import load_tokenizer
from toolbox.trainers.checkpoints import begin, commit
from toolbox.trainers.offline import OfflineTrainer

IDS = torch.tensor([[1, 5, 6, 7, 8, 9, 4], [2, 3, 3, 10, 11, 12, 13]])


@pytest.fixture(autouse=True)
def keep_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(IDS).logits


def trained_policy(model_dir: Path) -> PolicyRank:
    """A policy whose weights moved away from the base model's (so an export of the base would not pass)."""
    policy = PolicyRank.pretrained(str(model_dir), "float32", LearnerConfig(num_workers=1, strategy="single"), 1)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return policy


def test_export_hf_writes_a_directory_with_the_learners_logits(tiny_model_dir: Path, tmp_path: Path) -> None:
    policy = trained_policy(tiny_model_dir)
    assert policy.export_hf(tmp_path / "hf") == str(tmp_path / "hf")
    names = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    torch.testing.assert_close(logits(exported), logits(policy.model), atol=1e-5, rtol=0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert not torch.allclose(logits(base), logits(policy.model), atol=1e-3), "the test policy did not move"
    # The exported tokenizer is the run's own class (a char-level vocabulary must not turn into Qwen2's, which
    # drops spaces), with the same ids.
    mine, run = load_tokenizer(str(tmp_path / "hf")), load_tokenizer(str(tiny_model_dir))
    assert type(mine) is type(run) and mine("1+2=")["input_ids"] == run("1+2=")["input_ids"]


def fake_run(tiny_model_dir: Path, run_dir: Path, *overrides: str) -> PolicyRank:
    """A run directory as `toolbox.run` leaves it: config.yaml and a checkpoint of a (moved) policy at step 3."""
    cfg = load_config([f"model.path={tiny_model_dir}", "model.tiny=null", "learner.num_workers=1",
                       "learner.strategy=single", *overrides])
    run_dir.mkdir(parents=True)
    dump_config(cfg, run_dir / "config.yaml")
    policy = trained_policy(tiny_model_dir)
    final = run_dir / "checkpoints" / "step_3"
    commit(Path(policy.save(begin(final))), final, {"step": 3})  # staged, then marked complete, as trainers save
    return policy


def test_export_cli_converts_a_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    policy = fake_run(tiny_model_dir, run_dir)
    assert main([str(run_dir), str(tmp_path / "out")]) == 0  # a run directory: its latest checkpoint
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    torch.testing.assert_close(logits(exported), logits(policy.model), atol=1e-5, rtol=0)
    # A step directory works too; an existing model is kept unless --force.
    step = run_dir / "checkpoints" / "step_3"
    assert main([str(step), str(tmp_path / "out")]) == 2
    assert main([str(step), str(tmp_path / "out"), "--force"]) == 0


def test_export_cli_names_a_bad_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert "neither a run directory (with checkpoints/) nor a checkpoint" in " ".join(capsys.readouterr().err.split())
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ConfigError, match="the run has no checkpoint yet"):
        find_source(tmp_path)


def test_export_refuses_an_env_policy_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_1").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_1" / ".metadata").touch()
    (run_dir / "checkpoints" / "step_1" / "COMPLETE").touch()
    dump_config(load_config(["experiment=ppo_cartpole"]), run_dir / "config.yaml")
    with pytest.raises(ConfigError, match="algorithm 'ppo_env' trains an environment policy"):
        export_checkpoint(run_dir, tmp_path / "out")


def test_trainer_export_is_refused_for_ppo_env() -> None:
    with pytest.raises(ConfigError, match="trainer.export: ppo_env trains a small MLP policy"):
        load_config(["experiment=ppo_cartpole", "trainer.export=true"])


class ExportingLearner(FakeLearner):
    def __init__(self, rank: int, log: list[str]) -> None:
        super().__init__(rank)
        self.log = log

    def save(self, path: str) -> str:
        self.log.append(f"save {self.rank}")
        return super().save(path)

    def export_hf(self, path: str) -> str:
        self.log.append(f"export_hf {self.rank} {path}")
        return path


@pytest.mark.parametrize("export", [True, False])
def test_online_loop_exports_after_the_last_checkpoint(tmp_path: Path, export: bool) -> None:
    log: list[str] = []
    trainer, _, _ = make_trainer(tmp_path, [ExportingLearner(0, log), ExportingLearner(1, log)], total_steps=2,
                                 export=export)
    trainer.fit()
    hf = str(tmp_path / "hf")
    assert log == ["save 0", "save 1"] + ([f"export_hf 0 {hf}", f"export_hf 1 {hf}"] if export else [])


def test_offline_loop_exports_at_the_end(tmp_path: Path) -> None:
    from toolbox.actors.group import LocalGroup
    from toolbox.actors.roles import OfflineLearnerGroup

    class OfflineFake(ExportingLearner):
        def update_offline(self, step: int) -> dict[str, float]:
            return {"loss": 1.0}

    log: list[str] = []
    learner = OfflineLearnerGroup(LocalGroup("learner", [OfflineFake(0, log)]))
    OfflineTrainer(TrainerConfig(total_steps=1, export=True, final_eval=False), EventBus(), learner, tmp_path).fit()
    assert log == ["save 0", f"export_hf 0 {tmp_path / 'hf'}"]
