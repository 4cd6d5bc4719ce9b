"""``toolbox traces RUN_DIR --to sft|dpo OUT.jsonl`` (also ``python -m toolbox.commands.traces``): a run's samples as a dataset.

Reads the samples a run recorded (``RUN_DIR/samples.jsonl``, every ``trainer.log_samples_every`` steps)
and writes rows the SFT or DPO trainers read directly (``algorithm.dataset=OUT.jsonl``):

- ``--to sft``: rejection sampling, each recorded prompt's best response with a reward of at least
  ``--min-reward``;
- ``--to dpo``: each recorded prompt's best response against its worst, where their rewards differ by
  more than ``--min-margin``.

Multi-turn episodes become chat rows (messages; a DPO pair at the first model turn where they part).

See `toolbox.tracing.datasets` for the rules. Runs in this process: no Ray, no model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.markup import escape

from toolbox.callbacks.console import tool_main
from toolbox.core.errors import ConfigError
from toolbox.tracing.datasets import dpo_rows, read_samples, sft_rows


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="toolbox traces", description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("run", help="a run directory (its samples.jsonl), or a samples.jsonl file")
    p.add_argument("--to", choices=("sft", "dpo"), required=True, help="the dataset kind to write")
    p.add_argument("out", help="the JSONL file to write")
    p.add_argument("--min-reward", type=float, default=1.0, help="sft: least reward of a kept response (default 1.0)")
    p.add_argument("--min-margin", type=float, default=0.0,
                   help="dpo: least reward difference between chosen and rejected, exclusive (default 0)")
    return p.parse_args(argv)


def samples_file(run: str | Path) -> Path:
    """``RUN/samples.jsonl``, or ``run`` itself if it is a file; an error that says how samples get recorded."""
    path = Path(run)
    found = path if path.is_file() else path / "samples.jsonl"
    if not found.is_file():
        raise ConfigError(f"{path}: no samples.jsonl; a run records samples every trainer.log_samples_every steps "
                          "(rollout-based algorithms, with the jsonl callback)")
    return found


def convert(run: str | Path, kind: str, out: str | Path, min_reward: float = 1.0, min_margin: float = 0.0) -> int:
    """Write the ``kind`` (sft or dpo) dataset of ``run``'s samples to ``out``; returns the number of rows."""
    samples = read_samples(samples_file(run))
    rows = sft_rows(samples, min_reward) if kind == "sft" else dpo_rows(samples, min_margin)
    if not rows:
        rule = f"a reward >= {min_reward}" if kind == "sft" else f"rewards differing by more than {min_margin}"
        raise ConfigError(f"{run}: none of the {len(samples)} recorded samples gives a {kind} row (no group with {rule})")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with Path(out).open("w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 written, 2 bad arguments, no samples, or no rows."""
    return tool_main(argv, parse_args, _convert, "traces", (ConfigError, OSError))


def _convert(args: argparse.Namespace) -> str:
    n = convert(args.run, args.to, args.out, args.min_reward, args.min_margin)
    return f"wrote {n} {args.to} rows -> [bold]{escape(args.out)}[/]"

if __name__ == "__main__":
    sys.exit(main())
