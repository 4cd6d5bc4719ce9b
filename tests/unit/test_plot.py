"""`toolbox plot`: the dashboard of several runs from their metrics.jsonl (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from toolbox.callbacks import plots as plot
from toolbox.callbacks.files import CurveConfig, CurvePlot
from toolbox.commands.plot import main
from toolbox.core.events import Event, EventBus

LLM_STEP = {"reward": 0.5, "loss": 0.1, "kl": 0.01, "response_len": 4.0, "generate_s": 0.2, "reward_s": 0.05,
            "train_s": 0.5, "sync_s": 0.05, "step_time_s": 1.0}
ENV_STEP = {"episode_return": 20.0, "loss": 3.0, "approx_kl": 0.002, "episode_len": 20.0, "rollout_s": 0.1,
            "train_s": 0.2, "sync_s": 0.01, "step_time_s": 0.31}


def write_run(root: Path, name: str, step: dict[str, float], lr: float, steps: int = 12) -> Path:
    run = root / name
    run.mkdir()
    lines = [{"event": "step_end", "time": 0.0, "step": s, "metrics": {k: v * s for k, v in step.items()}}
             for s in range(1, steps + 1)]
    lines.insert(3, {"event": "eval_end", "time": 0.0, "step": 3, "metrics": {"reward": 1.0}})
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run / "config.yaml").write_text(yaml.safe_dump({"trainer": {"run_name": name}, "learner": {"optim": {"lr": lr}}}))
    return run


def test_two_runs_overlaid_with_a_legend_naming_what_differs(tmp_path: Path) -> None:
    a = write_run(tmp_path, "a", LLM_STEP, lr=1e-3)
    b = write_run(tmp_path, "b", LLM_STEP, lr=1e-4, steps=8)

    runs = [plot.read_run(d, label) for d, label in zip([a, b], plot.run_labels([a, b]))]
    fig = plot.dashboard_figure(runs)

    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["1: a (lr=0.001)", "2: b (lr=0.0001)"]
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == ["reward", "loss", "KL to the reference", "response length (tokens)", "step time"]
    assert runs[0].steps == list(range(1, 13))  # the eval_end record is not a step
    out = tmp_path / "out" / "dash.png"
    assert main([str(a), str(b), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_classic_rl_run_plots_return_and_a_missing_metric_is_named(tmp_path: Path) -> None:
    env = write_run(tmp_path, "cartpole", ENV_STEP, lr=3e-4)
    llm = write_run(tmp_path, "grpo", {k: v for k, v in LLM_STEP.items() if k != "kl"}, lr=3e-4)

    fig = plot.dashboard_figure([plot.read_run(env), plot.read_run(llm)])

    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert "reward / return (training episodes)" in panels
    assert "approx. KL (old -> new policy)" in panels  # only the env run reports a KL: grpo is named as missing
    notes = [t.get_text() for t in panels["approx. KL (old -> new policy)"].texts]
    assert notes == ["no data: grpo"]


def test_step_time_breakdown_puts_the_rest_in_waiting() -> None:
    run = plot.RunSeries("r")
    run.add(1, {"generate_s": 0.2, "reward_s": 0.1, "train_s": 0.4, "sync_s": 0.1, "step_time_s": 1.0})
    run.add(2, {"generate_s": 0.2, "reward_s": 0.1, "train_s": 0.4, "sync_s": 0.1, "step_time_s": 0.6})

    parts = plot.step_time_breakdown(run)

    assert parts == pytest.approx({"generation": 0.2, "reward": 0.1, "learning": 0.4, "sync": 0.1, "waiting": 0.0})
    run.add(3, {"generate_s": 0.2, "reward_s": 0.1, "train_s": 0.4, "sync_s": 0.1, "step_time_s": 2.0})
    assert plot.step_time_breakdown(run)["waiting"] == pytest.approx(0.4)


def test_a_directory_without_metrics_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    assert f"{tmp_path / 'metrics.jsonl'}: no such file" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text('{"event": "step_end", "step": 1, "metrics": {}}\nnot json\n')
    assert main([str(tmp_path)]) == 2
    assert f"{tmp_path / 'metrics.jsonl'}:2: not a JSON object" in capsys.readouterr().err


def test_the_curves_callback_draws_the_dashboard_at_the_end(tmp_path: Path) -> None:
    bus = EventBus()
    CurvePlot(CurveConfig(metrics=["reward", "grad_norm"]), tmp_path).attach(bus)
    for step in range(1, 4):
        bus.emit(Event.STEP_END, {"step": step, "metrics": {**LLM_STEP, "grad_norm": 1.0 / step}})
    bus.emit(Event.FIT_END, {"summary": {"experiment": "x"}})
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_the_curves_callback_draws_in_the_background_when_the_entry_point_asks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from toolbox.callbacks.files import wait_for_plots

    monkeypatch.setattr(CurvePlot, "background", True)  # what `toolbox.run` sets, then waits after Ray's shutdown
    bus = EventBus()
    CurvePlot(CurveConfig(metrics=["reward"]), tmp_path).attach(bus)
    bus.emit(Event.STEP_END, {"step": 1, "metrics": LLM_STEP})
    bus.emit(Event.FIT_END, {"summary": {"experiment": "x"}})
    wait_for_plots()
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_metric_flag_adds_a_panel_per_metric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_run(tmp_path, "tool", {**LLM_STEP, "reward/call": 0.05, "reward/answer": 0.02}, lr=1e-3)
    drawn: list[tuple[str, ...]] = []
    monkeypatch.setattr(plot, "dashboard", lambda runs, out, title="", extra=(): drawn.append(tuple(extra)) or out)
    assert main([str(run), "--metric", "reward/call", "--metric", "reward/answer"]) == 0
    assert drawn == [("reward/call", "reward/answer")]
    fig = plot.dashboard_figure([plot.read_run(run)], extra=drawn[0])
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()][4:6] == ["reward/call", "reward/answer"]
