"""Printing of the GRPO-vs-TRL benchmark: one table per model (every round of both sides) and its ratio line, on the
console and as a markdown report section (``--report``)."""

from __future__ import annotations

import os
from typing import Any

from toolbox.bench._report import Table, command_line, print_tables, section

COLUMNS = (("completions/s", "completions_per_s", "{:.2f}"), ("tokens/s", "tokens_per_s", "{:.0f}"),
           ("step s", "step_s", "{:.2f}"), ("generate s", "generate_s", "{:.2f}"), ("reward s", "reward_s", "{:.3f}"),
           ("train s", "train_s", "{:.2f}"), ("sync s", "sync_s", "{:.3f}"), ("other s", "other_s", "{:.2f}"),
           ("CPU s/step", "cpu_s", "{:.2f}"), ("completions/CPU s", "completions_per_cpu_s", "{:.2f}"),
           ("peak PSS MiB", "peak_pss_mib", "{:.0f}"), ("start-up s", "startup_s", "{:.1f}"))


def rows(result: dict[str, Any]) -> list[list[str]]:
    """Table cells: one row per (side, round), TRL first; a missing figure is '-'."""
    out = []
    for side in ("trl", "toolbox"):
        for r, run in enumerate(result[side]):
            out.append([side, str(r), *(fmt.format(run[key]) if key in run else "-" for _, key, fmt in COLUMNS)])
    return out


def ratio_line(result: dict[str, Any]) -> str:
    """``ratio X.XX``: toolbox's mean completions/s over TRL's (tokens/s and completions per CPU second in
    parentheses)."""
    cpu = f", per CPU s {result['ratio_cpu']:.2f}" if "ratio_cpu" in result else ""
    return f"ratio {result['ratio']:.2f} (tokens/s {result['ratio_tokens']:.2f}{cpu})"


def table(model: str, result: dict[str, Any], args: Any) -> Table:
    """The table of one model: every round of both sides, titled with the workload, toolbox's layout and the load."""
    sizes = result.get("sizes", {"prompts": 2, "group": 4, "micro_batch": 8})
    settings = result["toolbox"][0].get("settings", "") if result["toolbox"] else ""
    load = os.getloadavg()
    trained = f"LoRA r {sizes['lora']['r']}, lr {sizes['lr']:g}" if sizes.get("lora") else "full fine-tune"
    title = (f"GRPO vs TRL, model {model} ({trained}): {sizes['prompts']} prompts x {sizes['group']} samples, "
             f"{args.new_tokens} "
             f"new tokens, micro-batch {sizes.get('micro_batch', '-')}, {args.steps} timed steps after {args.warmup}; "
             f"toolbox: {settings}; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    return Table(title, ["side", "round", *(c for c, _, _ in COLUMNS)], rows(result))


def print_report(model: str, result: dict[str, Any], args: Any) -> None:
    """The model's table and its ratio line on the console."""
    print_tables([table(model, result, args)], [f"{model}: {ratio_line(result)}"])


def report_section(results: dict[str, Any], args: Any, argv: list[str]) -> str:
    """The markdown report section of a ``--vs trl`` invocation: its tables, ratio lines and what they measure."""
    tables = [table(model, result, args) for model, result in results.items()]
    notes = [f"**{model}: {ratio_line(result)}** (toolbox's mean completions/s over TRL's)"
             for model, result in results.items()]
    notes.append("Columns: per timed step, each side's wall time split by phase (TRL's generate and reward wrapped, "
                 "the rest of its step is train; toolbox's phases timed by its workers, overlapping with "
                 "generation sampled ahead, so they may add up to more than the step), CPU seconds of the whole "
                 "process tree, and the tree's peak PSS (sampled once a second: TRL's one process; toolbox's "
                 "driver, Ray daemons and actors). How the sides are kept equal: `toolbox/bench/_grpo_vs_trl.py`.")
    # Overrides in the heading: a run with other settings is a section of its own, not a replacement.
    given = [*(["--lora"] if getattr(args, "lora", False) else []), *(getattr(args, "overrides", None) or [])]
    extra = f" ({' '.join(given)})" if given else ""
    return section(f"GRPO against TRL: {', '.join(results)}{extra}", tables, notes, command_line("grpo", argv))
