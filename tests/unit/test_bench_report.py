"""The benchmarks' markdown report: tables, the environment lines, and sections replaced in place."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from toolbox.bench import _report
from toolbox.bench._report import Table, command_line, markdown_table, section, write_section


def test_markdown_table_has_title_header_rule_and_escaped_cells() -> None:
    text = markdown_table(Table("T", ["a", "b"], [["1", "x|y"], ["2", "-"]]))
    assert text.splitlines() == ["**T**", "", "| a | b |", "|---|---|", "| 1 | x\\|y |", "| 2 | - |"]


def test_command_line_is_quoted_and_says_when_it_ran_niced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_report.os, "nice", lambda inc: 0)
    assert command_line("grpo", ["--vs", "trl", "a b"]) == "toolbox bench grpo --vs trl 'a b'"
    monkeypatch.setattr(_report.os, "nice", lambda inc: 19)
    assert command_line("decode", ["--model", "smollm2"]) == "nice -n 19 toolbox bench decode --model smollm2"


def test_section_states_machine_date_versions_and_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_report, "git_commit", lambda: "abc1234")
    text = section("Bench X", [Table("t", ["h"], [["v"]])], ["A note."], "toolbox bench x", ("torch", "no-such-pkg"))
    lines = text.splitlines()
    assert lines[0] == "## Bench X"
    assert any(line.startswith("- Machine: ") and " cores, " in line for line in lines)
    assert any(line.startswith("- Date: ") and "UTC; load average" in line for line in lines)
    versions = next(line for line in lines if line.startswith("- Versions: "))
    assert "torch " in versions and "no-such-pkg not installed" in versions and "toolbox abc1234" in versions
    assert "- Command: `toolbox bench x`" in lines and "| v |" in lines and lines[-1] == "A note."


def test_write_section_replaces_its_own_heading_and_keeps_the_others(tmp_path: Path) -> None:
    report = tmp_path / "docs" / "r.md"
    write_section(report, "## A\n\nfirst a\n")
    write_section(report, "## B\n\nfirst b\n")
    write_section(report, "## A\n\nsecond a\n")
    text = report.read_text()
    assert text.startswith("# Benchmark reports\n")
    assert text.index("## A") < text.index("## B") and "second a" in text and "first a" not in text
    assert "first b" in text and text.count("## A") == 1 and text.endswith("first b\n")
    with pytest.raises(ValueError, match="a report section starts with '## '"):
        write_section(report, "no heading\n")


def test_grpo_report_section_has_a_table_per_model_and_the_ratio() -> None:
    from toolbox.bench._grpo_report import report_section

    run = {"completions_per_s": 2.0, "tokens_per_s": 128.0, "step_s": 4.0, "peak_pss_mib": 900.0}
    result = {"trl": [run], "toolbox": [{**run, "completions_per_s": 3.0, "settings": "1 rollout"}], "ratio": 1.5,
              "ratio_tokens": 1.5, "sizes": {"prompts": 2, "group": 4, "micro_batch": 4}}
    args = SimpleNamespace(new_tokens=64, steps=6, warmup=2)
    text = report_section({"smollm2": result}, args, ["--vs", "trl", "--model", "smollm2"])
    assert text.startswith("## GRPO against TRL: smollm2\n")
    assert "micro-batch 4" in text and "| trl | 0 | 2.00 |" in text and "| toolbox | 0 | 3.00 |" in text
    assert "**smollm2: ratio 1.50 (tokens/s 1.50)**" in text
    assert "toolbox bench grpo --vs trl --model smollm2`" in text
    varied = SimpleNamespace(new_tokens=64, steps=6, warmup=2, overrides=["learner.torch_threads=1"])
    heading = report_section({"smollm2": result}, varied, []).splitlines()[0]
    assert heading == "## GRPO against TRL: smollm2 (learner.torch_threads=1)"
