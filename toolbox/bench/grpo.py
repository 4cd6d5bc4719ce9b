"""Throughput of the default GRPO experiment's step: completions/s and where the time goes.

``python -m toolbox.bench grpo [--steps 30] [--warmup 3] [overrides ...]``

Runs the default experiment (``grpo_tiny``, real Ray, 2 FSDP2 learner ranks) and
reports, over the steps after warm-up, completions per second and the share of
step time spent generating, scoring, training and syncing weights. Each phase is timed by
the worker doing it (the longest shard); calls chain by ref, so scoring of one shard may
overlap generation of another and the shares need not add up to 100%.
"""

from __future__ import annotations

import argparse
import json
import tempfile


def phase_table(history: list[dict[str, float]], rows_per_step: int) -> dict[str, float]:
    """Sum the per-step phase timings (worker-side, possibly overlapping) into totals, shares and completions/s."""
    phases = ("generate_s", "reward_s", "train_s", "sync_s")
    totals = {p: sum(m[p] for m in history) for p in phases}
    step_total = sum(m["step_time_s"] for m in history)
    out = {"steps": len(history), "completions_per_s": rows_per_step * len(history) / step_total,
           "step_s": step_total / len(history)}
    for p in phases:
        out[f"{p.removesuffix('_s')}_share"] = totals[p] / step_total
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench grpo", description=__doc__)
    parser.add_argument("--steps", type=int, default=30, help="Timed steps.")
    parser.add_argument("--warmup", type=int, default=3, help="Untimed steps first.")
    parser.add_argument("--out", default="", help="Also write the results as JSON here.")
    parser.add_argument("overrides", nargs="*", help="Config overrides, as for toolbox.run.")
    args = parser.parse_args(argv)
    import ray
    from rich.console import Console
    from rich.table import Table

    from toolbox.algorithms.grpo.config import GRPOConfig
    from toolbox.config import load_config
    from toolbox.experiment import ExperimentBuilder, connect_ray

    run_root = tempfile.mkdtemp(prefix="bench-grpo-")
    cfg = load_config([f"trainer.total_steps={args.steps + args.warmup}", "trainer.eval_every=0", "callbacks=[]",
                       f"trainer.run_root={run_root}", *args.overrides])
    if not isinstance(cfg.algorithm, GRPOConfig):
        raise SystemExit(f"bench grpo needs a grpo experiment, got algorithm.name={cfg.algorithm.name!r}")
    rows_per_step = cfg.algorithm.rollouts_per_step
    builder = ExperimentBuilder(cfg)
    connect_ray(cfg, log_to_driver=False)
    try:
        trainer = builder.build_trainer()
        trainer.fit()
        result = phase_table(trainer.history[args.warmup :], rows_per_step)
    finally:
        builder.shutdown()
        ray.shutdown()
    table = Table(title=f"GRPO step ({cfg.experiment}: {rows_per_step} completions/step, "
                        f"{cfg.rollout.num_workers} rollout, {cfg.learner.num_workers} learner ranks)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:.1%}" if key.endswith("share") else f"{value:.3g}")
    Console().print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0
