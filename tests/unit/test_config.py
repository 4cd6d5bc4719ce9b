"""`toolbox.config`: errors that name the field path and the allowed values, batch arithmetic, dotted overrides."""

from __future__ import annotations

import pytest
import yaml

from toolbox.config import ExperimentConfig, load_config
from toolbox.config.loader import dump_config, merge, parse_overrides
from toolbox.core.errors import ConfigError
from toolbox.data.tasks import TASKS
from toolbox.engines import ENGINES
from toolbox.rewards import REWARDS


def config_error(*args: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(list(args))
    return str(info.value)


def test_default_config_validates() -> None:
    cfg = load_config([])
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.experiment == "grpo_tiny"
    # Each spec is typed by the entry its name selects, with that entry's defaults filled in.
    assert type(cfg.reward.spec) is REWARDS.spec_model("math")
    assert cfg.reward.spec.model_dump() == {"name": "math", "which": "first", "tolerance": 1e-6, "marker": "####"}
    assert type(cfg.rollout.engine) is ENGINES.spec_model("hf") and cfg.rollout.engine.max_batch_size == 256
    assert [c.name for c in cfg.callbacks] == ["console", "jsonl", "tensorboard", "curves"]
    # A dump keeps every option of the chosen entry, not only the base spec's name.
    dumped = cfg.model_dump()
    assert dumped["rollout"]["engine"] == {"name": "hf", "max_batch_size": 256, "decode": "lean", "forward": "auto",
                                                 "device": "cpu"}
    assert dumped["task"] == {"name": "digit_add", "max_operand": 4, "num_operands": 2}
    assert dumped["callbacks"][1] == {"name": "jsonl", "filename": "metrics.jsonl", "samples_filename": "samples.jsonl"}


def test_resolved_config_reloads_to_the_same_config(tmp_path) -> None:  # noqa: ANN001
    cfg = load_config(["rollout.engine.max_batch_size=64", "task.max_operand=7"])
    path = tmp_path / "config.yaml"
    dump_config(cfg, path)
    again = ExperimentConfig.model_validate(yaml.safe_load(path.read_text()))
    assert again == cfg


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
    assert "rollout.engine.name: 'foo' is not a registered engine; allowed: ['hf', 'http', " in msg


@pytest.mark.parametrize(("override", "message"), [
    ("reward.spec.name=nope", "reward.spec.name: 'nope' is not a registered reward; allowed: ['"),
    ("task.name=nope", "task.name: 'nope' is not a registered task; allowed: ['dataset', 'digit_add', "),
    ("callbacks.2.name=nope", "callbacks.2.name: 'nope' is not a registered callback; allowed: ['console', "),
    ("rollout.engine.max_batch_size=0", "rollout.engine.max_batch_size: Input should be greater than or equal to 1 (got 0)"),
    ("task.max_opernd=3", "task.max_opernd: Extra inputs are not permitted (got 3)"),
    ("rollout.engine=hf", "rollout.engine: must be a mapping with a 'name' (an engine spec) (got 'hf')"),
])
def test_spec_errors_name_the_field_path(override: str, message: str) -> None:
    assert message in config_error(override)


def test_spec_options_belong_to_the_named_entry() -> None:
    # max_batch_size is an hf option: a spec that selects vllm does not take it.
    msg = config_error("rollout.engine={name: vllm, max_batch_size: 64}")
    assert "rollout.engine.max_batch_size: Extra inputs are not permitted (got 64)" in msg


def test_reward_option_error_names_the_spec_path() -> None:
    msg = config_error("reward.spec.which=middle")
    assert "reward.spec.which: Input should be 'first' or 'last' (got 'middle')" in msg


def test_weighted_sum_components_are_typed_reward_specs() -> None:
    cfg = load_config(["reward.spec={name: weighted_sum, weights: [1.0], components: [{name: exact_match}]}"])
    assert type(cfg.reward.spec.components[0]) is REWARDS.spec_model("exact_match")
    msg = config_error("reward.spec={name: weighted_sum, weights: [1.0], components: [{name: math, which: middle}]}")
    assert "reward.spec.components.0.which: Input should be 'first' or 'last' (got 'middle')" in msg


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
    assert "128 must be a multiple of 7" in msg


def test_single_strategy_needs_one_rank() -> None:
    msg = config_error("learner.num_workers=2")  # grpo_tiny has learner.strategy=single
    assert "learner.strategy 'single'" in msg and "learner.num_workers is 2" in msg


def test_local_mode_needs_one_rank() -> None:
    assert "ray.local_mode" in config_error("experiment=grpo_tiny_fsdp2", "ray.local_mode=true")


def test_fields_ppo_does_not_use_are_errors_naming_each() -> None:
    # A field PPO does not read must not validate silently: PPO would train on settings the user never gets.
    msg = config_error("experiment=ppo_tiny", "algorithm.dynamic_sampling=true", "algorithm.advantage=rloo")
    assert "algorithm.dynamic_sampling: Extra inputs are not permitted (got True)" in msg
    assert "algorithm.advantage: Extra inputs are not permitted (got 'rloo')" in msg


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
    assert [c.model_dump() for c in cfg.callbacks] == [{"name": "jsonl", "filename": "m.jsonl",
                                                         "samples_filename": "samples.jsonl"}]


def test_list_index_edits_default_callbacks() -> None:
    # grpo_tiny does not list callbacks: the edit applies to the schema default, not a fresh list.
    cfg = load_config(["callbacks.1.filename=m.jsonl", "callbacks.0.name=jsonl"])
    assert [c.name for c in cfg.callbacks] == ["jsonl", "jsonl", "tensorboard", "curves"]
    assert cfg.callbacks[1].filename == "m.jsonl"
    assert cfg.callbacks[0].filename == "metrics.jsonl"  # renamed: console's options do not carry over


def test_list_index_out_of_range() -> None:
    assert "callbacks has only 4 entries" in config_error("callbacks.7.name=jsonl")


def test_list_index_bad_callback_option() -> None:
    msg = config_error("callbacks.1.nme=x")
    assert "callbacks.1" in msg and "nme" in msg


def test_spec_option_edits_default_spec() -> None:
    # grpo_tiny leaves the engine at its default: an option edits the default entry (hf).
    cfg = load_config(["rollout.engine.max_batch_size=64", "reward.spec.which=last"])
    assert cfg.rollout.engine.model_dump() == {"name": "hf", "max_batch_size": 64, "decode": "lean", "forward": "auto",
                                                 "device": "cpu"}
    assert cfg.reward.spec.model_dump() == {"name": "math", "which": "last", "tolerance": 1e-6, "marker": "####"}


def test_renaming_a_spec_drops_the_previous_entry_options(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "mine.yaml"
    path.write_text("base: grpo_tiny\ntask: {name: digit_add, max_operand: 7}\n")
    assert load_config([f"experiment={path}"]).task.max_operand == 7
    cfg = load_config([f"experiment={path}", "task.name=reverse"])  # digit_add's max_operand does not apply
    assert cfg.task.model_dump() == TASKS.spec_model("reverse")().model_dump()


def test_typed_overrides_reach_the_model() -> None:
    cfg = load_config(["learner.num_workers=1", "learner.strategy=single", "learner.optim.betas=[0.8, 0.9]",
                       "trainer.total_steps=7", "model.tiny=null", "model.path=/x"])
    assert cfg.learner.optim.betas == (0.8, 0.9)
    assert cfg.trainer.total_steps == 7 and cfg.model.tiny is None and cfg.model.path == "/x"


# ---- whole specs on the command line, renames anywhere, and where a bad value came from --------------------------
def write(tmp_path, name: str, text: str):  # noqa: ANN001, ANN201
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_whole_spec_on_the_command_line_replaces_the_old_one(tmp_path) -> None:  # noqa: ANN001
    path = write(tmp_path, "mine.yaml", "base: grpo_tiny\nreward: {spec: {name: math, which: last, tolerance: 0.5}}\n")
    assert load_config([f"experiment={path}", "reward.spec.tolerance=0.1"]).reward.spec.which == "last"  # merged
    cfg = load_config([f"experiment={path}", "reward.spec={name: math, tolerance: 0.1}"])  # replaced
    assert cfg.reward.spec.model_dump() == {"name": "math", "which": "first", "tolerance": 0.1, "marker": "####"}
    # A later dotted override still edits the whole spec given before it.
    cfg = load_config([f"experiment={path}", "reward.spec={name: math}", "reward.spec.which=last"])
    assert cfg.reward.spec.model_dump() == {"name": "math", "which": "last", "tolerance": 1e-6, "marker": "####"}


def test_renaming_a_nested_spec_drops_its_options(tmp_path) -> None:  # noqa: ANN001
    path = write(tmp_path, "ws.yaml", "base: grpo_tiny\nreward: {spec: {name: weighted_sum, weights: [1.0, 0.5], "
                 "components: [{name: math, which: last}, {name: format}]}}\n")
    cfg = load_config([f"experiment={path}", "reward.spec.components.0.name=exact_match"])
    assert cfg.reward.spec.components[0].model_dump() == {"name": "exact_match", "strip": True}


def test_errors_say_which_file_or_override_the_bad_value_came_from(tmp_path) -> None:  # noqa: ANN001
    base = write(tmp_path, "base.yaml", "base: grpo_tiny\nreward: {spec: {name: weighted_sum, weights: [1.0], "
                 "components: [{name: math, whch: last}]}}\n")
    top = write(tmp_path, "top.yaml", f"base: {base}\nalgorithm: {{kl_kind: k9}}\n")
    msg = config_error(f"experiment={top}", "rollout.engine.max_batch_size=0")
    assert f"reward.spec.components.0.whch: Extra inputs are not permitted (got 'last')  [from {base}]" in msg
    assert f"algorithm.kl_kind: Input should be 'k1', 'k2' or 'k3' (got 'k9')  [from {top}]" in msg
    assert ("rollout.engine.max_batch_size: Input should be greater than or equal to 1 (got 0)  "
            "[from command line: rollout.engine.max_batch_size=0]") in msg
    # A spec-level check (one weight per component) is blamed on what set the spec last.
    msg = config_error("reward.spec={name: weighted_sum, weights: [1.0], components: [{name: math}]}",
                       "reward.spec.weights=[1.0, 2.0]")
    assert ("reward.spec: Value error, weighted_sum: 1 components but 2 weights" in msg
            and msg.endswith("[from command line: reward.spec.weights=[1.0, 2.0]]"))


def test_http_engine_that_cannot_take_weights_is_refused_for_training() -> None:
    msg = config_error("rollout.engine={name: http, push_weights: false}")
    assert msg.startswith("rollout.engine: the http engine's server at http://127.0.0.1:8000/v1 does not take the "
                          "learner's weight updates (rollout.engine.push_weights is false)")
    assert "set rollout.engine.allow_stale_weights: true" in msg
    load_config(["rollout.engine={name: http, push_weights: false, allow_stale_weights: true}"])


def test_a_reward_that_cannot_be_built_fails_on_the_driver_before_ray() -> None:
    from toolbox.driver.preflight import check_specs

    def broken() -> None:
        raise ImportError("No module named 'judge_client'")

    REWARDS.register("test_unbuildable")(broken)
    try:
        with pytest.raises(ConfigError, match=r"^reward.spec: 'test_unbuildable' cannot be built: ImportError: No module "
                                              r"named 'judge_client'$"):
            check_specs(load_config(["reward.spec.name=test_unbuildable"]))
    finally:
        REWARDS.unregister("test_unbuildable")
    check_specs(load_config([]))
