"""``python -m toolbox.bench recipe EXPERIMENT [overrides ...] [--base-eval]``: one recipe, end to end, measured.

Runs ``toolbox run experiment=EXPERIMENT`` as a child process and reports what a user of the recipe asks first:
the wall time from launch to exit (training, periodic evaluation and export included), the peak memory of all
its processes together (driver, Ray's daemons, actors: PSS, so a shared page counts once; `toolbox.core.memory`),
and the run directory. Then ``toolbox eval`` scores the exported model (``RUN_DIR/hf``) and, with ``--base-eval``,
the untrained base with the same prompts, sampling and reward, and the table puts them side by side.

Not a comparison with another framework (``bench grpo --vs trl`` is): it measures toolbox's own recipe.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from toolbox.bench._report import Table as ReportTable
from toolbox.bench._report import command_line, print_tables, section, write_section
from toolbox.core.memory import PeakTreeMemory

RUN_DIR = re.compile(r"^results: (\S+)", re.MULTILINE)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="toolbox bench recipe", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("experiment", help="a shipped experiment name or a YAML path")
    parser.add_argument("--base-eval", action="store_true", help="also score the untrained base model")
    parser.add_argument("--eval-prompts", type=int, default=0, help="held-out prompts to score (0: the whole split)")
    parser.add_argument("--vs", choices=["trl"], default=None,
                        help="also train TRL's GRPOTrainer on the recipe's workload for the same training seconds, "
                        "score both sides' checkpoints and plot both curves (`toolbox.bench._recipe_vs_trl`)")
    parser.add_argument("--curve", action="store_true",
                        help="score every --every-th checkpoint too: held-out pass@1 over training seconds (--vs "
                        "implies it)")
    parser.add_argument("--every", type=int, default=10, help="with --curve or --vs: checkpoint and score every N steps")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--figures", type=Path, default=None,
                        help="report the figures of an earlier --out JSON instead of running (no run, no eval)")
    parser.add_argument("--report", type=Path, default=None,
                        help="write the tables, with the first held-out prompts' completions before and after, as a "
                        "markdown section into this file (docs/benchmarks/NAME.md)")
    return parser.parse_known_args(argv)


def run_recipe(experiment: str, overrides: list[str]) -> dict[str, Any]:
    """Launch the run as a child, sample the PSS of the whole process tree, return wall time, peak and run dir."""
    command = [sys.executable, "-m", "toolbox.run", f"experiment={experiment}", *overrides]
    start = time.perf_counter()
    with PeakTreeMemory(period_s=0.5) as memory:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - start
    sys.stderr.write(done.stderr[-4000:])
    if done.returncode != 0:
        raise SystemExit(f"bench recipe: `{' '.join(command)}` exited {done.returncode}")
    found = RUN_DIR.search(done.stdout + done.stderr)  # the console writes to stderr when stdout is not a tty
    if found is None:
        raise SystemExit("bench recipe: the run printed no `results: RUN_DIR` line")
    return {"wall_s": wall_s, "peak_pss_gib": memory.peak_mib / 1024, "run_dir": found.group(1),
            "at_peak_mib": [[label, round(mib)] for label, mib in memory.at_peak]}


def evaluate(experiment: str, model: str, overrides: list[str], prompts: int, out: Path) -> dict[str, float]:
    """``toolbox eval`` of ``model`` (empty: the experiment's base) with the recipe's settings; its metrics."""
    command = [sys.executable, "-m", "toolbox.commands.eval", f"experiment={experiment}", f"prompts={prompts}", f"out={out}",
               *([f"model={model}"] if model else []), *overrides]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return dict(json.loads((out / "eval.json").read_text())["metrics"])


CURVE_SETTINGS = ("trainer.save_every", "trainer.keep_checkpoints")  # what --curve adds to the run's overrides


def figures_table(figures: dict[str, Any]) -> ReportTable:
    rows = [["launch to exit (train, evaluate, export)", f"{figures['wall_s']:.0f} s"],
            ["peak memory, all processes (PSS)", f"{figures['peak_pss_gib']:.2f} GiB"]]
    for name in ("base", "trained"):
        if name in figures:
            metrics = figures[name]
            rows.append([f"held-out pass@1, {name}", f"{metrics['pass@1']:.3f} ({int(metrics['prompts'])} prompts)"])
    return ReportTable(f"recipe {figures['experiment']}", ["measure", "value"], rows)


def curve_table(curves: dict[str, list[dict[str, float]]]) -> ReportTable:
    """Each side's scored points: step, training seconds, held-out pass@1."""
    rows = [[side, f"{p['step']:.0f}", f"{p['train_s']:.0f}", f"{p['pass@1']:.3f}"]
            for side, points in curves.items() for p in points]
    return ReportTable(f"held-out pass@1 against training time: {' and '.join(curves)}",
                       ["side", "step", "training s", "pass@1"], rows)


def race_headline(race: dict[str, Any]) -> str:
    ours, theirs = race["at_equal"]["toolbox"], race["at_equal"]["trl"]
    return (f"**At equal training time ({race['equal_s']:.0f} s, the shorter side's): toolbox {ours['pass@1']:.3f} "
            f"held-out pass@1 after {ours['step']:.0f} steps, TRL {theirs['pass@1']:.3f} after {theirs['step']:.0f}.** "
            "Training time excludes start-up, model loads, evaluation and checkpoints on both sides; how the sides "
            "are kept equal: `toolbox/bench/_recipe_vs_trl.py`.")


def race_plot(figures: dict[str, Any], path: Path) -> Path:
    from toolbox.callbacks.plots import line_chart

    series = {side: [(p["train_s"], p["pass@1"]) for p in points] for side, points in figures["vs_trl"]["curves"].items()}
    return line_chart(series, path, "training seconds (2 CPU cores)", "held-out pass@1",
                      f"{figures['experiment']}: toolbox against TRL")


def memory_table(figures: dict[str, Any]) -> ReportTable:
    """Each process's PSS when the whole tree peaked: which role holds the memory."""
    rows = [[label, f"{mib}"] for label, mib in figures.get("at_peak_mib", [])]
    return ReportTable("memory at the peak, by process", ["process", "PSS MiB"], rows)


def examples_table(run_dir: Path, count: int = 4) -> ReportTable:
    """The first ``count`` held-out prompts (not picked: the split's order) with the base's and the trained
    model's completions and whether each passed."""
    def read(name: str) -> list[dict[str, Any]]:
        with (run_dir / name / "eval_samples.jsonl").open() as f:
            return [json.loads(line) for _, line in zip(range(count), f)]

    def shown(row: dict[str, Any]) -> str:
        mark = "right" if row["rewards"][0] >= 1.0 else "wrong"
        return f"`{' '.join(row['responses'][0].split())}` ({mark})"  # one line: a table cell

    rows = [[_question(b["prompt"]), b["answer"].rsplit("####", 1)[-1].strip(), shown(b), shown(t)]
            for b, t in zip(read("eval-base"), read("eval"))]
    return ReportTable("held-out completions, before and after", ["question", "answer", "base", "trained"], rows)


def _question(prompt: str) -> str:
    """The user's turn of a rendered chat prompt (the whole prompt when it has no such turn)."""
    return prompt.split("user\n", 1)[-1].split("\nassistant", 1)[0].strip()


def _without_figures(argv: list[str]) -> list[str]:
    """``argv`` less ``--figures FILE``: the command that measures what the report shows."""
    out, skip = [], False
    for arg in argv:
        if skip or arg == "--figures":
            skip = not skip
            continue
        out.append(arg)
    return out


def measure(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    """Run the recipe and score it: the trained model, with ``--base-eval`` the base, with ``--curve`` every
    checkpoint, with ``--vs trl`` TRL's points too."""
    figures: dict[str, Any] = {"experiment": args.experiment, "overrides": overrides,
                               **run_recipe(args.experiment, overrides)}
    run_dir = Path(figures["run_dir"])

    def score(config: str, model: str, out: Path) -> dict[str, float]:
        return evaluate(config, model, [], args.eval_prompts, out)

    # The run's own config.yaml holds its overrides: eval scores with exactly the run's settings.
    figures["trained"] = score(str(run_dir / "config.yaml"), str(run_dir), run_dir / "eval")
    if args.base_eval:
        figures["base"] = score(str(run_dir / "config.yaml"), "", run_dir / "eval-base")
    if args.curve:
        from toolbox.bench._recipe_vs_trl import checkpoint_curve, race

        figures["curve"] = checkpoint_curve(figures, args.every, score)
        if args.vs:
            figures["vs_trl"] = race(figures, args.every, score)
    return figures


def report(figures: dict[str, Any], args: argparse.Namespace, argv: list[str]) -> None:
    """Print the tables; with ``--report``, write them (and the plot of a ``--vs`` run) as a markdown section."""
    tables = [figures_table(figures)]
    if figures.get("at_peak_mib"):
        tables.append(memory_table(figures))
    if "base" in figures:
        tables.append(examples_table(Path(figures["run_dir"])))
    notes = []
    if "curve" in figures and "vs_trl" not in figures:
        tables.append(curve_table({"toolbox": figures["curve"]}))
    if "vs_trl" in figures:
        tables.append(curve_table(figures["vs_trl"]["curves"]))
        notes.append(race_headline(figures["vs_trl"]))
        if args.report:
            plot = args.report.with_name(f"{args.report.stem}_{figures['experiment']}_vs_trl.png")
            race_plot(figures, plot)
            notes.append(f"![{figures['experiment']} against TRL]({plot.name})")
    print_tables(tables, [f"run directory: {figures['run_dir']}", *notes])
    if args.report:
        # A run with other settings is a section of its own beside the recipe's, not a replacement.
        given = [o for o in figures.get("overrides", []) if o.split("=", 1)[0] not in CURVE_SETTINGS]
        heading = f"recipe {figures['experiment']}" + (f" ({' '.join(given)})" if given else "")
        write_section(args.report, section(heading, tables, notes, command_line("recipe", _without_figures(argv))))


def main(argv: list[str]) -> int:
    args, overrides = parse(argv)
    args.curve = args.curve or bool(args.vs)
    if args.curve:  # every point of the curve is a checkpoint to score
        overrides = [*overrides, f"trainer.save_every={args.every}", "trainer.keep_checkpoints=0"]
    figures = json.loads(args.figures.read_text()) if args.figures else measure(args, overrides)
    report(figures, args, argv)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0
