"""``model.cold_start``: the supervised run before RL (in process, no Ray), its exported policy, its cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.driver.cold_start import cold_start_dir
from toolbox.driver.preflight import resolve_model_path
from toolbox.models.loading import load_causal_lm


def recipe(tmp_path: Path, *overrides: str):  # noqa: ANN201 - ExperimentConfig
    return load_config(["experiment=grpo_tool_calc_tiny", f"trainer.run_root={tmp_path}", *overrides])


def test_cold_start_trains_once_and_the_run_starts_from_its_export(tmp_path: Path) -> None:
    cfg = recipe(tmp_path, "model.cold_start.overrides=[trainer.total_steps=2, algorithm.batch_size=8]")
    path = Path(resolve_model_path(cfg, tmp_path))
    assert path.parent.parent == tmp_path / ".models" and path.name == "hf"
    done = json.loads((path.parent / "cold_start.json").read_text())
    assert done["experiment"] == "sft_tool_calc_tiny" and done["summary"]["steps"] == 2
    sub = load_config(done["args"])  # what ran: the SFT recipe on this run's tiny model, in process
    assert sub.algorithm.name == "sft" and sub.ray.local_mode and sub.model.cold_start is None
    base = load_causal_lm(sub.model.path).state_dict()
    trained = load_causal_lm(str(path)).state_dict()
    assert any(not torch.equal(base[k], trained[k]) for k in base), "the cold start did not train"
    assert sub.task.name == "tool_add_demos"

    stamp = (path.parent / "cold_start.json").stat().st_mtime_ns
    assert resolve_model_path(cfg, tmp_path) == str(path)  # found, not trained again
    assert (path.parent / "cold_start.json").stat().st_mtime_ns == stamp
    other = recipe(tmp_path, "model.cold_start.overrides=[trainer.total_steps=3, algorithm.batch_size=8]")
    assert cold_start_dir(other, sub.model.path, tmp_path) != path.parent  # other inputs, another cold start
    assert cold_start_dir(cfg, sub.model.path, tmp_path) == path.parent


def test_a_bad_cold_start_experiment_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    cfg = recipe(tmp_path, "model.cold_start.overrides=[algorithm.batch_sise=8]")
    with pytest.raises(ConfigError, match=r"(?s)model\.cold_start: experiment .*sft_tool_calc_tiny.* algorithm\.batch_sise: Extra inputs"):
        resolve_model_path(cfg, tmp_path)
