"""Config groups: ``model=`` / ``data=`` / ``algorithm=`` compose shipped fragments over the experiment, and
``toolbox config --where`` says where each value came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolbox.commands import cli
from toolbox.config import load_config
from toolbox.config.loader import load_config_with_origins, origins
from toolbox.core.errors import ConfigError
from toolbox.core.paths import CONFIG_DIR
from toolbox.driver.experiment import ExperimentBuilder


def shipped(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("algorithm", shipped("algorithm"))
@pytest.mark.parametrize("data", shipped("data"))
def test_every_shipped_fragment_composes_with_the_default_experiment(algorithm: str, data: str) -> None:
    for model in shipped("model"):
        cfg = load_config([f"model={model}", f"data={data}", f"algorithm={algorithm}"])
        assert cfg.experiment == "grpo_tiny"


def test_groups_apply_data_then_algorithm_then_model_whatever_the_order() -> None:
    cfg = load_config(["model=smollm2-135m-instruct", "algorithm=ppo", "data=gsm8k", "algorithm.ppo_epochs=3"])
    assert cfg.model.tiny is None and cfg.model.path == "smollm2-135m-instruct"  # the model fragment came last
    assert cfg.task.name == "dataset" and cfg.reward.spec.name == "weighted_sum"
    assert cfg.algorithm.name == "ppo" and cfg.algorithm.ppo_epochs == 3  # dotted overrides win over fragments
    assert cfg.algorithm.prompts_per_step == 64  # the ppo fragment replaced grpo_tiny's section whole


def test_a_registered_algorithm_needs_no_fragment_and_a_mapping_is_an_override() -> None:
    assert load_config(["experiment=sft_tiny", "algorithm=sft"]).algorithm.name == "sft"
    cfg = load_config(["algorithm={name: online_dpo, prompts_per_step: 32, group_size: 4}"])
    assert cfg.algorithm.name == "online_dpo"


def test_an_unknown_fragment_lists_the_shipped_ones() -> None:
    with pytest.raises(ConfigError, match=r"data=gsm9k: no .*configs/data/gsm9k.yaml; shipped data fragments: "
                                          r"\['arith', 'digit_add', 'gsm8k'\]"):
        load_config(["data=gsm9k"])
    with pytest.raises(ConfigError, match=r"algorithm=ppoo: no .*ppoo.yaml or a registered algorithm; shipped"):
        load_config(["algorithm=ppoo"])


def test_a_fragment_can_be_a_file_of_ones_own(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("rollout: {sampling: {max_new_tokens: 5}}\n")
    assert load_config([f"data={mine}"]).rollout.sampling.max_new_tokens == 5


def test_where_names_the_file_the_group_the_command_line_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    cfg, layers = load_config_with_origins(["data=arith", "trainer.total_steps=3"])
    where = {path: source for path, _, source in origins(cfg, layers)}
    assert where["trainer.total_steps"] == "command line: trainer.total_steps=3"
    assert where["task.path"].startswith("data=arith (") and where["task.path"].endswith("configs/data/arith.yaml)")
    assert where["learner.micro_batch_size"].endswith("configs/experiments/grpo_tiny.yaml")
    assert where["trainer.seed"] == "default"
    assert cli.main(["config", "--where", "data=arith", "trainer.total_steps=3"]) == 0
    out = capsys.readouterr().out
    assert "trainer.total_steps: 3  # command line: trainer.total_steps=3\n" in out
    assert 'task.name: "dataset"  # data=arith (' in out


def test_a_grouped_experiment_trains(tmp_path: Path) -> None:
    args = ["data=arith", "algorithm=rloo", "ray.local_mode=true", "callbacks=[]", "trainer.eval_every=0",
            "trainer.final_eval=false", f"trainer.run_root={tmp_path}", "trainer.total_steps=2",
            "algorithm.prompts_per_step=4", "algorithm.group_size=4"]
    trainer = ExperimentBuilder(load_config(args)).build_trainer()
    trainer.fit()
    assert len(trainer.history) == 2 and all("reward" in m for m in trainer.history)
