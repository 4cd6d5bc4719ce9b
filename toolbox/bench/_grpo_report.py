"""Printing of the GRPO-vs-TRL benchmark: one table per model (every round of both sides) and its ratio line."""

from __future__ import annotations

import os
from typing import Any

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


def print_report(model: str, result: dict[str, Any], args: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    settings = result["toolbox"][0].get("settings", "") if result["toolbox"] else ""
    load = os.getloadavg()
    table = Table(title=f"GRPO vs TRL, model {model}: 2 prompts x 4 samples, {args.new_tokens} new tokens, "
                        f"{args.steps} timed steps after {args.warmup}; toolbox: {settings}; "
                        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for col in ("side", "round", *(c for c, _, _ in COLUMNS)):
        table.add_column(col, justify="right")
    for cells in rows(result):
        table.add_row(*cells)
    console = Console(width=200)
    console.print(table)
    console.print(f"{model}: {ratio_line(result)}", markup=False, highlight=False)
