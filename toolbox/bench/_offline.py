"""Shared harness of the offline benchmarks (``sft``, ``dpo``): ours against TRL on the same model and batches.

Each framework runs in a fresh spawned process, so its peak RSS (``ru_maxrss``) is
its own; the harness reports samples/s and (non-padding) input tokens/s over the
steps after warm-up, peak RSS and its growth over the process's RSS after imports,
and the ratios to TRL when TRL is installed (``pip install -e '.[bench]'``).
Where TRL's batch does not count samples (SFT packing: it packs the dataset into
rows first), its samples/s is its tokens/s over the mean sample length.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Timing:
    """What a runner measured: ``perf_counter`` at each step's end, input tokens of each step, samples per step."""

    ends: list[float]
    tokens: list[float]
    samples_per_step: float | None


Runner = Callable[[argparse.Namespace, str], Timing]


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m toolbox.bench {name}", description=doc)
    p.add_argument("--steps", type=int, default=20, help="Timed optimizer steps.")
    p.add_argument("--warmup", type=int, default=3, help="Untimed steps first.")
    p.add_argument("--batch-size", type=int, default=32, help="Samples per optimizer step (one micro-batch).")
    p.add_argument("--max-length", type=int, default=64, help="Longest sequence in tokens.")
    p.add_argument("--max-operand", type=int, default=9, help="digit_add operands are 0..this.")
    p.add_argument("--threads", type=int, default=1, help="torch threads in each framework's process.")
    p.add_argument("--no-trl", action="store_true", help="Skip TRL even when it is installed.")
    p.add_argument("--out", default="", help="Also write the results as JSON here.")
    return p


def rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def tiny_model(args: argparse.Namespace, root: str) -> str:
    """The GRPO benchmark's tiny model (default `TinyModelConfig`) for the digit_add alphabet."""
    from toolbox.data.tasks import TASKS
    from toolbox.models.loading import TinyModelConfig
    from toolbox.models.tiny import ensure_tiny_model

    task = TASKS.build({"name": "digit_add", "max_operand": args.max_operand})
    return str(ensure_tiny_model(os.path.join(root, "tiny"), TinyModelConfig(), task.alphabet()))


def records(args: argparse.Namespace, kind: str) -> list[list[dict[str, Any]]]:
    """Every step's batch of records, identical for both frameworks."""
    from toolbox.data.offline import RecordSource
    from toolbox.data.tasks import TASKS

    source = RecordSource(kind, 0, task=TASKS.build({"name": "digit_add", "max_operand": args.max_operand}))  # type: ignore[arg-type]
    return [source.step(s, args.batch_size) for s in range(args.warmup + args.steps)]


def mean_sample_tokens(args: argparse.Namespace, model_dir: str, name: str) -> float:
    """Mean tokens per sample (a pair counts both sequences) of the benchmark's records, as we tokenise them."""
    from toolbox.data.encode import encode_preference, encode_sft
    from toolbox.models.loading import load_tokenizer

    tok = load_tokenizer(model_dir)
    recs = [r for batch in records(args, "sft" if name == "sft" else "preference") for r in batch]
    if name == "sft":
        lengths = [len(encode_sft(r, tok, args.max_length)) for r in recs]
    else:
        lengths = [sum(len(e) for e in encode_preference(r, tok, args.max_length)) for r in recs]
    return sum(lengths) / len(lengths)


def _measure(runner: Runner, args: argparse.Namespace, model_dir: str) -> dict[str, float]:
    import torch

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = rss_mb()
    t = runner(args, model_dir)
    if len(t.ends) != args.warmup + args.steps:
        raise RuntimeError(f"{runner.__module__}.{runner.__name__} ran {len(t.ends)} steps, not {args.warmup + args.steps}")
    timed = t.ends[-1] - t.ends[args.warmup - 1] if args.warmup else t.ends[-1]
    tokens_per_s = sum(t.tokens[args.warmup :]) / timed
    samples = args.steps * t.samples_per_step / timed if t.samples_per_step else tokens_per_s / args.mean_sample_tokens
    peak = rss_mb()
    return {"samples_per_s": samples, "tokens_per_s": tokens_per_s, "step_ms": 1000 * timed / args.steps,
            "peak_rss_mb": peak, "rss_growth_mb": peak - base}


def measure(runner: Runner, args: argparse.Namespace, model_dir: str) -> dict[str, float]:
    """Run ``runner`` (returns the ``perf_counter`` at the end of every step) in a fresh process."""
    pool = mp.get_context("spawn").Pool(1)
    try:
        return pool.apply(_measure, (runner, args, model_dir))
    finally:  # close + join (not the context manager's terminate) lets the child clean up after itself
        pool.close()
        pool.join()


def trl_available() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def compare(name: str, unit: str, ours: Runner, theirs: Runner, args: argparse.Namespace) -> int:
    """Measure both, print a table (and the ratio), optionally write JSON; returns the exit code."""
    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as root:
        model_dir = tiny_model(args, root)
        args.mean_sample_tokens = mean_sample_tokens(args, model_dir, name)
        results = {"toolbox": measure(ours, args, model_dir)}
        if not args.no_trl and trl_available():
            results["trl"] = measure(theirs, args, model_dir)
    table = Table(title=f"{name}: batch {args.batch_size}, {args.steps} timed steps, max_length {args.max_length}, "
                        f"{args.threads} thread(s)")
    for col in ("framework", f"{unit}/s", "tokens/s", "ms/step", "peak RSS MiB", "RSS growth MiB"):
        table.add_column(col, justify="right")
    for fw, r in results.items():
        table.add_row(fw, f"{r['samples_per_s']:.1f}", f"{r['tokens_per_s']:.0f}", f"{r['step_ms']:.1f}",
                      f"{r['peak_rss_mb']:.0f}", f"{r['rss_growth_mb']:.0f}")
    console = Console()
    console.print(table)
    if "trl" in results:
        mine, trl = results["toolbox"], results["trl"]
        results["ratio_vs_trl"] = {k: mine[k] / trl[k] for k in ("samples_per_s", "tokens_per_s", "peak_rss_mb")}
        console.print("toolbox / TRL: " + ", ".join(f"{k} {v:.2f}x" for k, v in results["ratio_vs_trl"].items()))
    else:
        console.print("TRL not measured (install the 'bench' extra: pip install -e '.[bench]')")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def step_timer() -> Any:
    """A transformers `TrainerCallback` recording ``perf_counter`` and the input tokens seen at every step end."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.seen: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.ends.append(time.perf_counter())
            self.seen.append(float(state.num_input_tokens_seen))

        def timing(self, samples_per_step: float | None) -> Timing:
            tokens = [b - a for a, b in zip([0.0, *self.seen], self.seen)]
            return Timing(self.ends, tokens, samples_per_step)

    return StepTimer()


def run_learner(learner: Any, args: argparse.Namespace) -> Timing:
    """Our side: ``learner.update(step)`` for every step, timed, with the input tokens it reports."""
    ends, tokens = [], []
    for step in range(args.warmup + args.steps):
        tokens.append(learner.update(step)["train_tokens"])
        ends.append(time.perf_counter())
    return Timing(ends, tokens, args.batch_size)


def trl_common(args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    """TRL/transformers Trainer arguments matching our learner: AdamW, constant lr, clip 1.0, fp32 on CPU, no I/O."""
    return dict(output_dir=out_dir, per_device_train_batch_size=args.batch_size, gradient_accumulation_steps=1,
                max_steps=args.warmup + args.steps, learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0,
                weight_decay=0.0, max_grad_norm=1.0, logging_strategy="no", save_strategy="no", report_to=[],
                use_cpu=True, dataloader_num_workers=0, seed=0, disable_tqdm=True, max_length=args.max_length,
                bf16=False, fp16=False, include_num_input_tokens_seen="non_padding")
