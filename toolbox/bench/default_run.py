"""``python -m toolbox.bench default_run``: the default experiment, launch to exit, against TRL's ``GRPOTrainer``.

``python -m toolbox.bench default_run [--steps 200] [--rounds 2] [--override KEY=VALUE ...] [--out FILE]``

Both sides are fresh processes timed from their launch to their exit, so each pays its own start-up (imports,
building the tiny model; for toolbox also Ray and its actors) and its own steps:

- **toolbox**: ``python -m toolbox.run experiment=grpo_tiny trainer.total_steps=STEPS trainer.eval_every=0``
  with the experiment's own settings (its layout, checkpoints every ``trainer.save_every`` steps, its console),
  plus any ``--override``.
- **TRL**: ``trl.GRPOTrainer`` (CPU, fp32, all cores) on the same tiny model, built the same way from the same
  seed, the same prompt sequence (toolbox's ``PromptSource`` of the experiment's task and seed, decoded to text,
  unshuffled) and the same reward (the experiment's ``reward.spec``), with the experiment's hyper-parameters:
  ``prompts_per_step x group_size`` completions per optimizer step in micro-batches of
  ``learner.micro_batch_size``, ``max_new_tokens`` stopping at EOS, temperature, ``kl_coef`` as ``beta`` (TRL's
  KL is k3), ``loss.clip_low`` / ``loss.clip_high`` as ``epsilon`` / ``epsilon_high``, TRL's token-mean ``dapo`` loss,
  AdamW with the experiment's lr, schedule, warm-up, weight decay and gradient clip; no checkpoints, no logging.

Printed per run: launch -> end of step 1, launch -> exit, the training time after step 1 and its seconds per step,
the mean reward of the first and last 10% of steps, the peak memory of all the side's processes together (PSS, so
a page shared by several processes counts once: toolbox's ``RUN_DIR/memory.json`` over the driver, Ray's daemons
and the actors; TRL's one process, sampled the same way, `toolbox.core.memory`); then the medians and ``ratio X.XX``: TRL's median
launch-to-exit time over toolbox's (above 1: toolbox finishes first). The sides alternate, who goes first flips
each round. Evaluation is off on both sides (TRL's run has none to match).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from toolbox.bench._grpo_vs_trl import run_child
from toolbox.bench.startup import one_run, with_experiment


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m toolbox.bench default_run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="training steps of each run")
    p.add_argument("--rounds", type=int, default=2, help="runs per side (medians reported)")
    p.add_argument("--override", action="append", default=[], help="a dotted config override for both sides "
                   "(toolbox's run takes it; TRL's takes what it changes of the shared settings)")
    p.add_argument("--sides", default="toolbox,trl", help="comma-separated: toolbox, trl")
    p.add_argument("--out", default="", help="write every run's figures here as JSON")
    return p.parse_args(argv)


def trl_spec(overrides: list[str], steps: int) -> dict[str, Any]:
    """The TRL side's settings, read off the experiment's resolved config (see the module docstring)."""
    from toolbox.config import load_config

    cfg = load_config(overrides)
    alg, optim, sampling = cfg.algorithm, cfg.learner.optim, cfg.rollout.sampling
    if cfg.model.tiny is None:
        raise SystemExit("bench default_run compares runs on the experiment's tiny model (model.tiny is null)")
    rows = alg.prompts_per_step * alg.group_size
    micro = min(cfg.learner.micro_batch_size, rows)  # the config made sure a step splits into whole micro-batches
    return {
        "steps": steps, "seed": cfg.trainer.seed, "tiny": cfg.model.tiny.model_dump(), "task": cfg.task.model_dump(),
        "reward": cfg.reward.spec.model_dump(),
        "sizes": {"prompts": alg.prompts_per_step, "group": alg.group_size, "new_tokens": sampling.max_new_tokens,
                  "lr": optim.lr},
        "settings": {"per_device_train_batch_size": micro, "gradient_accumulation_steps": rows // micro,
                     "generation_kwargs": {}, "temperature": sampling.temperature, "top_p": sampling.top_p,
                     "beta": getattr(alg, "kl_coef", 0.0), "epsilon": alg.loss.clip_low, "epsilon_high": alg.loss.clip_high,
                     "loss_type": "dapo", "lr_scheduler_type": optim.scheduler, "warmup_steps": optim.warmup_steps,
                     "weight_decay": optim.weight_decay, "max_grad_norm": optim.max_grad_norm, "seed": cfg.trainer.seed},
    }


def trl_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In the fresh TRL process: build the tiny model, train, return step ends (``time.time()``) and rewards."""
    from transformers.utils import logging as hf_logging

    from toolbox.bench._grpo_trl import run_trl
    from toolbox.bench._grpo_vs_trl import prompt_rows
    from toolbox.data.tasks import TASKS
    from toolbox.models.loading import TinyModelConfig
    from toolbox.models.tiny import ensure_tiny_model

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="bench-default-trl-") as root:
        alphabet = TASKS.build(spec["task"]).alphabet()
        model_dir = str(ensure_tiny_model(Path(root) / "tiny", TinyModelConfig(**spec["tiny"]), alphabet))
        rows = prompt_rows(model_dir, spec["sizes"], spec["steps"], task=spec["task"], seed=spec["seed"])
        raw = run_trl(model_dir, rows, spec["reward"], spec["sizes"], **spec["settings"])
    return {"step_ends": raw["wall_ends"], "rewards": raw["rewards"], "peak_pss_mib": raw["peak_pss_mib"]}


def run_trl_side(spec: dict[str, Any], log_dir: Path, name: str) -> dict[str, Any]:
    """Launch `trl_child` as ``python -m toolbox.bench.default_run SPEC OUT`` and time it from outside."""
    launched = time.time()
    got = run_child("toolbox.bench.default_run", spec, log_dir, name, "bench default_run: the TRL side")
    return {**figures("trl", launched, time.time() - launched, got["step_ends"], got["rewards"]),
            "peak_pss_mib": got["peak_pss_mib"]}


def run_toolbox_side(overrides: list[str], steps: int, run_root: Path, name: str) -> dict[str, Any]:
    """`toolbox.bench.startup.one_run` of the experiment, and its steps read back from its metrics.jsonl."""
    run = one_run("", steps, overrides, run_root, name)
    records = [json.loads(line) for line in (run_root / name / "metrics.jsonl").read_text().splitlines()]
    steps_done = [r for r in records if r.get("event") == "step_end"]
    launched = steps_done[0]["time"] - run["to_step_1_s"]
    return {**figures("toolbox", launched, run["to_exit_s"], [r["time"] for r in steps_done],
                      [r["metrics"]["reward"] for r in steps_done]), "tree_cpu_to_step_1_s": run["tree_cpu_s"],
            "peak_pss_mib": json.loads((run_root / name / "memory.json").read_text())["peak_pss_mib"]}


def figures(side: str, launched: float, exited: float, ends: list[float], rewards: list[float]) -> dict[str, Any]:
    """One run's figures from its launch time, launch-to-exit seconds, step-end times and per-step rewards."""
    if len(ends) < 2:
        raise RuntimeError(f"bench default_run: the {side} side ended {len(ends)} steps; it needs at least 2")
    tenth = max(1, len(rewards) // 10)
    return {"side": side, "steps": len(ends), "to_step_1_s": ends[0] - launched, "to_exit_s": exited,
            "train_after_step_1_s": ends[-1] - ends[0], "s_per_step": (ends[-1] - ends[0]) / (len(ends) - 1),
            "reward_first_10pct": statistics.fmean(rewards[:tenth]),
            "reward_last_10pct": statistics.fmean(rewards[-tenth:])}


def report(runs: list[dict[str, Any]]) -> list[str]:
    """A table of the runs, the medians per side and, with both sides, ``ratio X.XX``."""
    keys = ["to_step_1_s", "to_exit_s", "train_after_step_1_s", "s_per_step", "reward_first_10pct",
            "reward_last_10pct", "peak_pss_mib"]
    lines = ["| side | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {r['side']} | " + " | ".join(f"{r[k]:.3f}" if k.startswith(("s_", "reward")) else f"{r[k]:.1f}"
                                               for k in keys) + " |" for r in runs]
    medians = {}
    for side in dict.fromkeys(r["side"] for r in runs):
        medians[side] = {k: statistics.median(r[k] for r in runs if r["side"] == side) for k in keys}
        lines.append(f"median [{side}]: " + ", ".join(f"{k} {v:.3f}" for k, v in medians[side].items()))
    if {"toolbox", "trl"} <= medians.keys():
        lines.append(f"ratio {medians['trl']['to_exit_s'] / medians['toolbox']['to_exit_s']:.2f}"
                     "  (TRL's launch-to-exit time over toolbox's; above 1: toolbox finishes first)")
    return lines


def main(argv: list[str]) -> int:
    args = parse(argv)
    overrides = with_experiment(args.override)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if unknown := set(sides) - {"toolbox", "trl"}:
        raise SystemExit(f"--sides: unknown {sorted(unknown)} (toolbox, trl)")
    if "trl" in sides and importlib.util.find_spec("trl") is None:
        print("TRL is not installed (pip install -e '.[bench]'): the toolbox side alone", flush=True)
        sides.remove("trl")
    spec = trl_spec(overrides, args.steps) if "trl" in sides else {}
    root = Path(tempfile.mkdtemp(prefix="bench-default-run-"))
    load_before = os.getloadavg()
    runs = []
    for r in range(args.rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            name = f"{side}-{r}"
            run = (run_toolbox_side(overrides, args.steps, root, name) if side == "toolbox"
                   else run_trl_side(spec, root, name))
            runs.append(run)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in run.items()}), flush=True)
    print(*report(runs), sep="\n")
    print(f"load average (1, 5, 15 min): before {load_before}, after {os.getloadavg()}; runs and logs: {root}")
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": runs, "overrides": overrides, "load_before": load_before,
                                              "load_after": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    spec_file, out_file = sys.argv[1:3]
    Path(out_file).write_text(json.dumps(trl_child(json.loads(Path(spec_file).read_text()))))
