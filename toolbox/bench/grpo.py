"""Throughput of a GRPO step: completions/s and where the time goes; ``--vs trl`` compares with TRL.

``python -m toolbox.bench grpo [--steps 30] [--warmup 3] [overrides ...]``

Runs the default experiment (``grpo_tiny``, real Ray, 2 FSDP2 learner ranks) and
reports, over the steps after warm-up, completions per second and the share of
step time spent generating, scoring, training and syncing weights. Each phase is timed by
the worker doing it (the longest shard); calls chain by ref, so scoring of one shard may
overlap generation of another and the shares need not add up to 100%. Start-up (Ray, each
role's actors ready, the first weight sync) is reported too.

``python -m toolbox.bench grpo --vs trl [--model small|medium|both|smollm2] [--rounds 2] [--steps 8] [overrides ...]``

GRPO on random Qwen2 models with a locally trained byte-level BPE tokenizer (``small``, ``medium``; ``both``
runs the two) or on the pretrained SmolLM2-135M-Instruct with chat-templated arithmetic prompts (``smollm2``;
its directory from ``--model-path``, ``$TOOLBOX_BENCH_SMOLLM2`` or the model catalog), TRL's ``GRPOTrainer``
against toolbox's ``grpo`` with its best settings for a 2-core machine (overrides go on top of them),
each in a fresh process, alternating; how it is kept fair: `toolbox.bench._grpo_vs_trl`. Needs the
``bench`` extra (``pip install -e '.[bench]'``).

``--report PATH`` also writes the tables as a markdown section (machine, date, versions, command) into PATH.
"""

from __future__ import annotations

import argparse
import json


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


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench grpo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vs", choices=["trl"], default=None, help="Compare with this framework.")
    parser.add_argument("--model", choices=["small", "medium", "both", "smollm2"], default="both",
                        help="--vs trl: benchmark model(s); both = small and medium.")
    parser.add_argument("--model-path", default="", help="--model smollm2: its directory (default: "
                        "$TOOLBOX_BENCH_SMOLLM2, else the model catalog's smollm2-135m-instruct).")
    parser.add_argument("--rounds", type=int, default=2, help="--vs trl: rounds of both sides, alternating.")
    parser.add_argument("--steps", type=int, default=None, help="Timed steps (default 30; --vs trl: 8).")
    parser.add_argument("--warmup", type=int, default=None, help="Untimed steps first (default 3; --vs trl: 2).")
    parser.add_argument("--new-tokens", type=int, default=64, help="--vs trl: tokens per completion.")
    parser.add_argument("--lora", action="store_true",
                        help="--vs trl --model smollm2: train LoRA adapters on both sides (the grpo_smollm2_arith "
                        "recipe's: r 16 on every linear layer, lr 5e-4; toolbox syncs the adapter alone) instead of "
                        "the full model")
    parser.add_argument("--trl-threads", type=int, default=2, help="--vs trl: torch threads of TRL's process.")
    parser.add_argument("--logs", default="", help="--vs trl: keep each side's log and result files here.")
    parser.add_argument("--out", default="", help="Also write the results as JSON here.")
    parser.add_argument("--report", default="", help="Also write the tables as a markdown section into this file "
                        "(replacing its section of the same heading).")
    parser.add_argument("overrides", nargs="*", help="Config overrides, as for toolbox.run.")
    args = parser.parse_args(argv)
    vs = args.vs is not None
    args.steps = args.steps if args.steps is not None else (8 if vs else 30)
    args.warmup = args.warmup if args.warmup is not None else (2 if vs else 3)
    if args.steps < 1 or args.warmup < (1 if vs else 0) or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1, --warmup at least 1 with --vs (TRL's first step "
                     "has no start time)")
    if args.model_path and args.model != "smollm2":
        parser.error("--model-path goes with --model smollm2 (the other models are built on the spot)")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.vs == "trl":
        from toolbox.bench._grpo_report import report_section
        from toolbox.bench._grpo_vs_trl import compare

        result = compare(args)
        text = report_section(result, args, argv)
    else:
        result, text = default_experiment(args, argv)
    if args.report:
        from toolbox.bench._report import write_section

        write_section(args.report, text)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def default_experiment(args: argparse.Namespace, argv: list[str]) -> tuple[dict[str, float], str]:
    """The step table of the default experiment (with ``args.overrides``) and its start-up split, printed; the
    results and their markdown report section."""
    from toolbox.bench._grpo_run import run_experiment
    from toolbox.bench._report import Table, command_line, print_tables, section

    run = run_experiment(list(args.overrides), args.steps, args.warmup)
    result = {**phase_table(run.history[args.warmup :], run.rows_per_step), "peak_pss_mib": run.peak_pss_mib,
              **{f"startup_{k}": v for k, v in run.startup.items()}}
    table = Table(f"GRPO step ({run.rows_per_step} completions/step; {run.settings})", ["metric", "value"],
                  [[key, f"{value:.1%}" if key.endswith("share") else f"{value:.3g}"] for key, value in result.items()])
    print_tables([table])
    return result, section("GRPO step: default experiment", [table], [], command_line("grpo", argv))
