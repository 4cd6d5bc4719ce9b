"""``toolbox bench recipe``: the figures and examples tables, read from a run directory; no run started."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from toolbox.bench import recipe


def _eval_dir(run: Path, name: str, responses: list[str], rewards: list[float]) -> None:
    (run / name).mkdir(parents=True)
    rows = [{"prompt": f"system\nS\nuser\nWhat is {i} + 1?\nassistant\n", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}",
             "responses": [r], "rewards": [w]} for i, (r, w) in enumerate(zip(responses, rewards))]
    (run / name / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_examples_pair_base_and_trained_in_split_order(tmp_path: Path) -> None:
    _eval_dir(tmp_path, "eval-base", ["Sure! 0 + 1\nis", "2", "x", "y", "z"], [0.0, 1.2, 0.0, 0.0, 0.0])
    _eval_dir(tmp_path, "eval", ["#### 1", "#### 2", "#### 3", "#### 5", "#### 5"], [1.2, 1.2, 1.2, 0.2, 1.2])
    table = recipe.examples_table(tmp_path)
    assert len(table.rows) == 4  # the first four, not the best four
    assert table.rows[0] == ["What is 0 + 1?", "1", "`Sure! 0 + 1 is` (wrong)", "`#### 1` (right)"]
    assert table.rows[3][3] == "`#### 5` (wrong)"


def test_figures_table_and_the_command_a_report_names() -> None:
    figures = {"experiment": "x", "wall_s": 700.4, "peak_pss_gib": 3.456,
               "base": {"pass@1": 0.2, "prompts": 200}, "trained": {"pass@1": 0.61, "prompts": 200}}
    rows = recipe.figures_table(figures).rows
    assert rows[0][1] == "700 s" and rows[1][1] == "3.46 GiB"
    assert rows[2] == ["held-out pass@1, base", "0.200 (200 prompts)"]
    assert rows[3] == ["held-out pass@1, trained", "0.610 (200 prompts)"]
    assert recipe._without_figures(["x", "--figures", "f.json", "--report", "r.md"]) == ["x", "--report", "r.md"]


def _metrics(run: Path, step_times: list[float]) -> None:
    lines = [{"event": "step_end", "step": i, "metrics": {"step_time_s": t}} for i, t in enumerate(step_times, 1)]
    lines.insert(2, {"event": "eval_end", "step": 2, "metrics": {"greedy_reward": 0.5}})  # not a step
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_toolbox_points_sum_step_time_at_every_kth_step_and_the_last(tmp_path: Path) -> None:
    from toolbox.bench._recipe_vs_trl import toolbox_points

    _metrics(tmp_path, [10.0, 5.0, 5.0, 4.0, 6.0])
    assert toolbox_points(tmp_path, 2) == [{"step": 2.0, "train_s": 15.0}, {"step": 4.0, "train_s": 24.0},
                                           {"step": 5.0, "train_s": 30.0}]


def test_equal_time_takes_the_shorter_sides_budget() -> None:
    from toolbox.bench._recipe_vs_trl import equal_time

    ours = [{"step": 0, "train_s": 0, "pass@1": 0.1}, {"step": 10, "train_s": 100, "pass@1": 0.3},
            {"step": 20, "train_s": 200, "pass@1": 0.5}]
    # TRL stopped on the budget (its last step crossed toolbox's 200 s): both last points
    stopped = [ours[0], {"step": 7, "train_s": 150, "pass@1": 0.2}, {"step": 9, "train_s": 205, "pass@1": 0.25}]
    found = equal_time({"toolbox": ours, "trl": stopped})
    assert found["equal_s"] == 200 and found["at_equal"]["trl"]["step"] == 9 and found["at_equal"]["toolbox"]["step"] == 20
    # TRL ran out of steps at 150 s: toolbox's last point within 150 s, not a later one
    short = [ours[0], {"step": 20, "train_s": 150, "pass@1": 0.4}]
    found = equal_time({"toolbox": ours, "trl": short})
    assert found["equal_s"] == 150 and found["at_equal"]["toolbox"]["step"] == 10
    headline = recipe.race_headline(found)
    assert "toolbox 0.300" in headline and "TRL 0.400 after 20" in headline and "(150 s" in headline


def test_race_plot_and_table(tmp_path: Path) -> None:
    curves = {"toolbox": [{"step": 0.0, "train_s": 0.0, "pass@1": 0.1}, {"step": 10.0, "train_s": 90.0, "pass@1": 0.3}],
              "trl": [{"step": 0.0, "train_s": 0.0, "pass@1": 0.1}, {"step": 6.0, "train_s": 95.0, "pass@1": 0.2}]}
    figures = {"experiment": "x", "vs_trl": {"curves": curves}}
    path = recipe.race_plot(figures, tmp_path / "race.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    table = recipe.curve_table(curves)
    assert table.rows[-1] == ["trl", "6", "95", "0.200"] and table.title.endswith("toolbox and trl")


def test_memory_at_the_peak_names_each_process() -> None:
    import subprocess
    import sys

    import psutil

    from toolbox.core.memory import PeakTreeMemory, _label

    with PeakTreeMemory(period_s=0.05) as memory:
        subprocess.run([sys.executable, "-m", "json.tool", "--help"], capture_output=True, check=True)
    assert memory.at_peak and abs(sum(mib for _, mib in memory.at_peak) - memory.peak_mib) < 1e-6
    assert _label(psutil.Process()) in [label for label, _ in memory.at_peak]  # this process, as it was started
    fake = SimpleNamespace(cmdline=lambda: ["/venv/bin/python", "-m", "toolbox.run", "experiment=x"], name=lambda: "py")
    assert _label(fake) == "python -m toolbox.run"  # type: ignore[arg-type]
    ray = SimpleNamespace(cmdline=lambda: ["ray::RolloutWorker.generate"], name=lambda: "ray::Rollout")
    assert _label(ray) == "ray::RolloutWorker.generate"  # type: ignore[arg-type]
    table = recipe.memory_table({"at_peak_mib": [["ray::RolloutWorker", 800]]})
    assert table.rows == [["ray::RolloutWorker", "800"]]


def test_a_run_with_other_settings_reports_as_a_section_of_its_own(tmp_path: Path) -> None:
    figures = {"experiment": "x", "wall_s": 10.0, "peak_pss_gib": 1.0, "run_dir": str(tmp_path),
               "overrides": ["learner.lora=null", "trainer.save_every=10", "trainer.keep_checkpoints=0"],
               "trained": {"pass@1": 0.5, "prompts": 8},
               "curve": [{"step": 10.0, "train_s": 50.0, "pass@1": 0.5}]}
    out = tmp_path / "report.md"
    recipe.report(figures, SimpleNamespace(report=out), ["x", "--curve", "learner.lora=null"])
    text = out.read_text()
    assert "## recipe x (learner.lora=null)\n" in text and "| toolbox | 10 | 50 | 0.500 |" in text
