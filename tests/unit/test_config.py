"""`toolbox.config`: errors that name the field path and the allowed values, batch arithmetic, dotted overrides."""

from __future__ import annotations

import pytest

from toolbox.config import ExperimentConfig, load_config
from toolbox.config.loader import merge, parse_overrides
from toolbox.core.errors import ConfigError


def config_error(*args: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(list(args))
    return str(info.value)


def test_default_config_validates() -> None:
    cfg = load_config([])
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.experiment == "grpo_tiny"
    # Registry validation fills each spec's defaults in place.
    assert cfg.reward.spec == {"name": "math", "which": "first", "tolerance": 1e-6}
    assert cfg.rollout.engine["name"] == "hf" and "max_batch_size" in cfg.rollout.engine
    assert [c["name"] for c in cfg.callbacks] == ["console", "jsonl", "tensorboard", "curves"]


def test_typo_field_names_the_path() -> None:
    msg = config_error("algorithm.group_sise=3")
    assert "algorithm.group_sise" in msg and "Extra inputs are not permitted" in msg
    assert "algorithm.grpo." not in msg  # the tagged union's tag is not part of a path a user can write


def test_unknown_algorithm_lists_the_allowed_names() -> None:
    msg = config_error("algorithm.name=nope")
    assert "algorithm" in msg and "'nope'" in msg and "'grpo'" in msg
    assert "algorithm.grpo" not in msg


def test_bad_literal_lists_the_allowed_values() -> None:
    msg = config_error("algorithm.kl_kind=k4")
    assert "algorithm.kl_kind" in msg and "'k4'" in msg
    assert all(k in msg for k in ("'k1'", "'k2'", "'k3'"))


def test_unknown_registry_name_lists_registered() -> None:
    msg = config_error("rollout.engine.name=foo")
    assert "rollout.engine.name" in msg and "'foo'" in msg
    assert "hf" in msg and "vllm" in msg


def test_reward_option_error_names_the_spec_path() -> None:
    msg = config_error("reward.spec.which=middle")
    assert "reward.spec.which" in msg and "'first'" in msg and "'last'" in msg and "middle" in msg


def test_unknown_experiment_lists_known_ones() -> None:
    msg = config_error("experiment=no_such_experiment")
    assert "experiment=no_such_experiment" in msg and "grpo_tiny" in msg


def test_missing_yaml_experiment_file(tmp_path) -> None:  # noqa: ANN001
    msg = config_error(f"experiment={tmp_path / 'absent.yaml'}")
    assert "file not found" in msg


def test_experiment_from_a_yaml_path(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "mine.yaml"
    path.write_text("algorithm: {group_size: 4}\nlearner: {num_workers: 1, strategy: single}\n")
    cfg = load_config([f"experiment={path}"])
    assert cfg.experiment == "mine" and cfg.algorithm.group_size == 4


def test_batch_arithmetic_over_ranks() -> None:
    msg = config_error("learner.num_workers=3")
    assert "batch arithmetic" in msg and "learner.num_workers=3" in msg
    assert "16 x 8 = 128" in msg


def test_batch_arithmetic_micro_batches() -> None:
    msg = config_error("learner.micro_batch_size=7")
    assert "batch arithmetic" in msg and "learner.micro_batch_size=7" in msg
    assert "64" in msg and "multiple of 7" in msg


def test_single_strategy_needs_one_rank() -> None:
    msg = config_error("learner.strategy=single")  # grpo_tiny has learner.num_workers=2
    assert "learner.strategy 'single'" in msg and "learner.num_workers is 2" in msg


def test_local_mode_needs_one_rank() -> None:
    assert "ray.local_mode" in config_error("ray.local_mode=true")


def test_unknown_advantage() -> None:
    msg = config_error("algorithm.advantage=nope")
    assert "algorithm.advantage" in msg and "group_norm" in msg and "rloo" in msg


# ---- overrides ---------------------------------------------------------------------------------
def test_parse_overrides_scalars_nesting_and_lists() -> None:
    out = parse_overrides(["a.b.c=1", "a.b.d=x", "a.e=1.5e-3", "f=true", "g=[1, 2]", "h=", "i=[{name: jsonl}]"])
    assert out == {"a": {"b": {"c": 1, "d": "x"}, "e": 1.5e-3}, "f": True, "g": [1, 2], "h": "", "i": [{"name": "jsonl"}]}


@pytest.mark.parametrize("arg", ["novalue", "=3"])
def test_parse_overrides_rejects_malformed(arg: str) -> None:
    with pytest.raises(ConfigError, match="a.b.c=value"):
        parse_overrides([arg])


def test_parse_overrides_value_then_section() -> None:
    with pytest.raises(ConfigError, match="set to a value and also used as a section"):
        parse_overrides(["a=1", "a.b=2"])


def test_parse_overrides_bad_yaml() -> None:
    with pytest.raises(ConfigError, match="cannot parse"):
        parse_overrides(["a=[1, 2"])


def test_merge_recursive_and_list_index() -> None:
    base = {"a": {"x": 1, "y": 2}, "l": [{"name": "p", "k": 1}, {"name": "q"}], "s": 3}
    over = {"a": {"y": 20}, "l": {"1": {"name": "r"}, "0": {"k": 5}}}
    assert merge(base, over) == {"a": {"x": 1, "y": 20}, "l": [{"name": "p", "k": 5}, {"name": "r"}], "s": 3}
    assert base["l"][0] == {"name": "p", "k": 1}  # the input is not mutated
    with pytest.raises(ConfigError, match="has only 2 entries"):
        merge(base, {"l": {"2": {"name": "z"}}})


def test_list_override_replaces_callbacks() -> None:
    cfg = load_config(["callbacks=[{name: jsonl, filename: m.jsonl}]"])
    assert cfg.callbacks == [{"name": "jsonl", "filename": "m.jsonl"}]


def test_list_index_edits_default_callbacks() -> None:
    # grpo_tiny does not list callbacks: the edit applies to the schema default, not a fresh list.
    cfg = load_config(["callbacks.1.filename=m.jsonl", "callbacks.0.name=jsonl"])
    assert [c["name"] for c in cfg.callbacks] == ["jsonl", "jsonl", "tensorboard", "curves"]
    assert cfg.callbacks[1]["filename"] == "m.jsonl"


def test_list_index_out_of_range() -> None:
    assert "callbacks has only 4 entries" in config_error("callbacks.7.name=jsonl")


def test_list_index_bad_callback_option() -> None:
    msg = config_error("callbacks.1.nme=x")
    assert "callbacks.1" in msg and "nme" in msg


def test_spec_option_edits_default_spec() -> None:
    cfg = load_config(["rollout.engine.max_batch_size=64", "reward.spec.which=last"])
    assert cfg.rollout.engine == {"name": "hf", "max_batch_size": 64}
    assert cfg.reward.spec["which"] == "last" and cfg.reward.spec["name"] == "math"


def test_typed_overrides_reach_the_model() -> None:
    cfg = load_config(["learner.num_workers=1", "learner.strategy=single", "learner.optim.betas=[0.8, 0.9]",
                       "trainer.total_steps=7", "model.tiny=null", "model.path=/x"])
    assert cfg.learner.optim.betas == (0.8, 0.9)
    assert cfg.trainer.total_steps == 7 and cfg.model.tiny is None and cfg.model.path == "/x"
