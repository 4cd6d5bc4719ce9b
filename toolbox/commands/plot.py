"""``toolbox plot RUN_DIR [RUN_DIR ...] [-o OUT.png]`` (also ``python -m toolbox.commands.plot``): one dashboard PNG
of runs, drawn by `toolbox.callbacks.plots` (the library the ``curves`` callback draws with too)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolbox.callbacks.plots import plot_runs


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 written, 1 nothing to plot, 2 a bad argument or an unreadable run directory."""
    parser = argparse.ArgumentParser(prog="toolbox plot", description="One dashboard PNG of runs: reward (the return of "
                                     "classic-RL runs), loss, KL, response length and the step-time breakdown, the runs "
                                     "overlaid with a legend.")
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (each with a metrics.jsonl)")
    parser.add_argument("-o", "--out", type=Path, default=None,
                        help="PNG to write (default: RUN_DIR/dashboard.png of the first run)")
    parser.add_argument("--title", default="", help="title above the panels")
    parser.add_argument("--metric", action="append", default=[], metavar="KEY",
                        help="also plot this step metric in a panel of its own (repeatable), e.g. reward/answer")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out or args.run_dirs[0] / "dashboard.png"
    try:
        written = plot_runs(args.run_dirs, out, args.title, args.metric)
    except ValueError as err:
        print(f"toolbox plot: {err}", file=sys.stderr)
        return 2
    if written is None:
        print(f"toolbox plot: no step metrics in {', '.join(map(str, args.run_dirs))}", file=sys.stderr)
        return 1
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
