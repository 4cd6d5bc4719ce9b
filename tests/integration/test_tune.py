"""Ray Tune sweeps where every trial is a whole experiment (in-process, or with real actors)."""

from __future__ import annotations

import csv
import json
import os
import runpy
import signal
import threading
import time
from pathlib import Path

import pytest

from toolbox.commands.tune import INTERRUPTED, main

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Tiny in-process trials: one learner rank, 4 prompts a step.
TINY = ("trainer.eval_every=0, ray.local_mode=true, learner.num_workers=1, learner.strategy=single, "
        "algorithm.prompts_per_step=4, learner.micro_batch_size=8")


def run_sweep(tmp_path: Path, sweep_yaml: str) -> tuple[Path, list[dict[str, str]]]:
    """Write the sweep, run it (it must succeed), return its directory and its results.csv rows."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(sweep_yaml)
    assert main([f"sweep={sweep}", f"trainer.run_root={tmp_path / 'out'}"]) == 0
    (sweep_dir,) = (tmp_path / "out" / "sweeps").iterdir()
    return sweep_dir, list(csv.DictReader((sweep_dir / "results.csv").open()))


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def tune_trials(sweep_dir: Path) -> dict[str, tuple[bool, int]]:
    """Trial name -> (done, results Tune has processed), from Tune's own records (result.json) of the sweep.
    With trainer.save_every=1 every result carries a checkpoint."""
    out = {}
    for trial in sweep_dir.glob("tune/*/run_trial_*"):
        lines = (trial / "result.json").read_text().splitlines() if (trial / "result.json").exists() else []
        done = bool(lines) and json.loads(lines[-1]).get("done") is True
        out["_".join(trial.name.split("_")[:4])] = (done, len(lines))
    return out


def restarts(run_dir: Path) -> list[int]:
    """The step each restart of a trial continued from (its step_end steps restart at or below the last one);
    fails if a restart skipped a step or came after steps that no checkpoint covered."""
    saved, last, out = 0, 0, []
    for event in events(run_dir):
        if event["event"] == "checkpoint_saved":
            saved = event["step"]
        elif event["event"] == "step_end":
            step = event["step"]
            assert step <= saved + 1, f"{run_dir.name}: step {step} after checkpoint {saved}"
            if step <= last:
                out.append(step)
            last = step
    return out


def ended_trials(sweep_dir: Path) -> set[str]:
    """Trial ids the sweep's own record (``ended.json``, written in Tune's ``on_trial_complete``) holds."""
    path = sweep_dir / "ended.json"
    return set(json.loads(path.read_text())) if path.exists() else set()


def interrupt_when_a_trial_is_done(sweeps: Path) -> threading.Thread:
    """SIGUSR1 to this process (Tune's interrupt, as Ctrl+C) once a trial has ended (finished or stopped by
    ASHA); the other running trial is then mid-run with checkpoints.

    ``result.json`` says done as soon as Tune has the result, but the trial's status (what Tune's state
    snapshot keeps) turns TERMINATED later, after its checkpoint is saved; an interrupt in between runs the
    trial again on resume. Tune calls ``on_trial_complete`` (which writes ``ended.json``) in the same
    controller step that sets TERMINATED, and handles an interrupt only between steps."""
    def watch() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if any(ended_trials(d) for d in sweeps.glob("*")):
                os.kill(os.getpid(), signal.SIGUSR1)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_asha_sweep_stops_trials_early_survives_an_interrupt_and_resumes(ray_session: None, tmp_path: Path) -> None:
    """4 trials, 2 at a time, ASHA on response length, which max_new_tokens bounds: trials 3 and 4 start when
    1 or 2 has passed the first rung and trail them, so they stop early. The sweep is interrupted once Tune
    has a trial done; ``resume=true`` finishes the rest without running a done trial again, and a trial that
    was running with a Tune checkpoint continues after it instead of starting over."""
    steps = 8
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "experiment: grpo_tiny_fsdp2\n"
        f"overrides: [trainer.total_steps={steps}, trainer.save_every=1, {TINY}]\n"
        "metric: response_len\nmode: max\nmax_concurrent_trials: 2\n"
        "scheduler: {name: asha, grace_period: 1, reduction_factor: 2}\n"
        "param_space:\n  rollout.sampling.max_new_tokens: {grid: [4, 3, 2, 1]}\n"
    )
    args = [f"sweep={sweep}", f"trainer.run_root={tmp_path / 'out'}"]
    watcher = interrupt_when_a_trial_is_done(tmp_path / "out" / "sweeps")
    assert main(args) == INTERRUPTED
    watcher.join(timeout=1)
    (sweep_dir,) = (tmp_path / "out" / "sweeps").iterdir()
    runs = sweep_dir / "runs"
    at_interrupt = tune_trials(sweep_dir)
    ended = ended_trials(sweep_dir)
    done_before = {name: len(events(runs / name)) for name in at_interrupt if name.removeprefix("run_trial_") in ended}
    # A trial's last result before the interrupt may miss Tune's final snapshot; the one before it may not.
    to_restore = [name for name, (done, results) in at_interrupt.items() if results >= 2 and not done]
    assert done_before and not (sweep_dir / "results.csv").exists()

    assert main([*args, "resume=true"]) == 0
    rows = list(csv.DictReader((sweep_dir / "results.csv").open()))
    assert sorted(int(r["config/rollout.sampling.max_new_tokens"]) for r in rows) == [1, 2, 3, 4]
    stopped = {int(r["config/rollout.sampling.max_new_tokens"]) for r in rows if int(r["step"]) < steps}
    assert {1, 2} <= stopped, f"ASHA did not stop the trailing trials early: {rows}"
    for name, n_events in done_before.items():
        assert len(events(runs / name)) == n_events, f"{name} was done and ran again after resume"
    for name in to_restore:
        assert restarts(runs / name) and min(restarts(runs / name)) > 1, f"{name} started over after resume"
    for run_dir in runs.glob("run_trial_*"):
        restarts(run_dir)  # no trial skipped steps
    print(f"done before the interrupt: {sorted(done_before)}; restored from a checkpoint: {to_restore}")

    best = max(rows, key=lambda r: float(r["score"]))
    assert (sweep_dir / "sweep.png").exists()
    from toolbox.config import load_config

    cfg = load_config([f"experiment={sweep_dir / 'best.yaml'}"])
    assert cfg.rollout.sampling.max_new_tokens == int(best["config/rollout.sampling.max_new_tokens"]) == 4
    assert cfg.trainer.total_steps == steps and cfg.learner.strategy == "single"


def test_a_bad_value_in_the_space_fails_before_any_trial(tmp_path: Path) -> None:
    sweep = tmp_path / "bad.yaml"
    sweep.write_text("experiment: grpo_tiny_fsdp2\nparam_space:\n  learner.num_workers: {grid: [2, 3]}\n")
    assert main([f"sweep={sweep}", f"trainer.run_root={tmp_path}"]) == 2
    assert not (tmp_path / "sweeps").exists()


def test_the_python_api_example_runs(ray_session: None, tmp_path: Path) -> None:
    """docs/examples/tune_api.py: a Tuner built in Python around the toolbox trainable."""
    example = runpy.run_path(str(REPO / "docs" / "examples" / "tune_api.py"))
    results = example["main"]([f"trainer.run_root={tmp_path}", "trainer.total_steps=2",
                               *TINY.replace(" ", "").split(",")])
    assert len(results) == 2 and not results.num_errors
    assert max(r.metrics["step"] for r in results) == 2


def test_trials_place_their_actors_in_the_trial_placement_group(ray_session: None, tmp_path: Path) -> None:
    """Real actors (2 FSDP2 learner ranks per trial) inside each trial's own placement group, 2 trials at once."""
    from toolbox.config import load_config
    from toolbox.driver.placement import trial_bundles

    cfg = load_config(["experiment=grpo_tiny_fsdp2", "rollout.num_workers=1", "reward.num_workers=1"])
    assert trial_bundles(cfg) == [{"CPU": 0.01}, {"CPU": 0.25}, {"CPU": 0.1}, {"CPU": 0.5}, {"CPU": 0.5}]
    _, rows = run_sweep(tmp_path, (
        "experiment: grpo_tiny_fsdp2\n"
        "overrides: [trainer.total_steps=2, trainer.eval_every=0, rollout.num_workers=1, reward.num_workers=1,\n"
        "            algorithm.prompts_per_step=4, learner.micro_batch_size=8]\n"
        "max_concurrent_trials: 2\n"
        "param_space:\n  algorithm.kl_coef: {grid: [0.0, 0.05]}\n"
    ))
    assert len(rows) == 2 and all(r["step"] == "2" for r in rows)
