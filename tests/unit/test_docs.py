"""The generated reference docs match the code (regenerate with `make docs`)."""

from __future__ import annotations

from toolbox.commands.reference import DOCS, components_markdown, config_rows, configuration_markdown
from toolbox.config import ExperimentConfig


def test_configuration_reference_is_current() -> None:
    assert (DOCS / "configuration.md").read_text() == configuration_markdown(), "run `make docs` and commit"


def test_component_catalog_is_current() -> None:
    assert (DOCS / "components.md").read_text() == components_markdown(), "run `make docs` and commit"


def test_reference_lists_each_registered_entrys_options() -> None:
    paths = {row[0]: row for row in config_rows(ExperimentConfig)}
    assert paths["rollout.engine"][1] == "one of hf, http, multi_turn, sglang, vllm" and paths["rollout.engine"][2] == "'hf'"
    assert not any(p.startswith("rollout.engine[name=multi_turn].engine[") for p in paths)  # the wrapped engine: one row
    assert "rollout.engine[name=vllm].gpu_memory_utilization" in paths
    assert "reward.spec[name=math].which" in paths and "task[name=reverse].letters" in paths
    assert "callbacks.<i>[name=jsonl].filename" in paths
    # A spec inside one of its own registry's entries is listed once, not expanded again.
    assert paths["reward.spec[name=weighted_sum].components"][1].startswith("list, each one of ")
    assert not any(p.startswith("reward.spec[name=weighted_sum].components.<i>[") for p in paths)
