"""Generation speed of the ``hf`` engine: its lean decode loop against ``model.generate``, same prompts, same seeds.

``python -m toolbox.bench decode [--cases small,medium,grpo_tiny,medium_eos] [--rounds 2] [--repeats 3]``

``python -m toolbox.bench decode --model smollm2 [--batches 1,32] [--dtypes fp32,bf16] [--report PATH]``: the
pretrained SmolLM2-135M-Instruct's decode speed against the memory-bandwidth bound, and bf16 against fp32 for
generation and training (`toolbox.bench._decode_bound`).

Cases: ``small`` / ``medium`` are the GRPO-vs-TRL benchmark's random Qwen2 models with a
byte-level BPE tokenizer (2 prompts x 4 samples, 64 new tokens, fp32); ``grpo_tiny`` is the default
experiment's tiny char-level model and batch (16 prompts x 8, 4 new tokens); ``medium_eos`` is
``medium`` with its EOS logit raised so rows stop at different lengths, which is where dropping
finished rows (``lean``) and decoding padding for them (``lean_masked``) differ; ``lean_transformers`` is the lean
loop with transformers' forward instead of toolbox's own (``rollout.engine.forward``), both of them on the weights
as loaded (row-major; the own forward keeps them column-major, which its paths' untimed warm-up call does). Each round runs every
path of a case in turn (alternating), ``--repeats`` generate calls each, from the same seed; the
report gives seconds per call (the median over rounds; wall clock and this process's CPU time,
steadier on a loaded machine), generated tokens/s, the speed-up over ``generate`` and whether every
path sampled the very same tokens. Threads: ``--threads`` (default 1,
what a rollout worker with one CPU gets). Not timed: model load.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

PATHS = ("generate", "lean_transformers", "lean", "lean_masked")


@dataclass(frozen=True)
class Case:
    """One benchmark case: a model, a batch shape and a response length."""

    model: str  # "small" / "medium" (BPE models) or "tiny" (grpo_tiny's char model)
    prompts: int
    samples: int
    max_new_tokens: int
    eos_bias: float = 0.0  # added to the EOS logit, so rows finish early


CASES = {
    "small": Case("small", 2, 4, 64),
    "medium": Case("medium", 2, 4, 64),
    "grpo_tiny": Case("tiny", 16, 8, 4),
    "medium_eos": Case("medium", 2, 4, 64, eos_bias=4.0),
}


def build_engine(case: Case, root: Path) -> Any:
    """An ``hf`` engine on the case's model (built under ``root`` once), its EOS logit raised by ``eos_bias``."""
    import torch

    from toolbox.engines.hf import HFEngine, HFEngineConfig

    # The transformers model, which every path runs on (`path_call` sets the path's forward).
    engine = HFEngine(model_dir(case.model, root), config=HFEngineConfig(forward="transformers"))
    if case.eos_bias:
        head = engine.model.get_output_embeddings()
        biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
        with torch.no_grad():
            biased.weight.copy_(head.weight)
            biased.bias.zero_()
            biased.bias[engine.tokenizer.eos_token_id] = case.eos_bias
        engine.model.set_output_embeddings(biased)
    return engine


def model_dir(name: str, root: Path) -> str:
    from toolbox.bench._bpe_models import build_model
    from toolbox.data.tasks import TASKS
    from toolbox.models.loading import TinyModelConfig
    from toolbox.models.tiny import ensure_tiny_model

    if (root / name / "config.json").exists():
        return str(root / name)
    if name == "tiny":
        alphabet = TASKS.build({"name": "digit_add"}).alphabet()
        return str(ensure_tiny_model(root / name, TinyModelConfig(), alphabet))
    return build_model(root, name)


def requests_for(case: Case, tokenizer: Any) -> list[Any]:
    """``prompts`` digit_add prompts (grpo_tiny's task), each repeated ``samples`` times."""
    from toolbox.data.tasks import TASKS
    from toolbox.rl.batch import PromptRequest

    problems = TASKS.build({"name": "digit_add"}).sample(case.prompts, random.Random(0))
    return [PromptRequest(tokenizer(p.prompt)["input_ids"], g) for g, p in enumerate(problems)
            for _ in range(case.samples)]


def path_call(engine: Any, path: str, case: Case, requests: list[Any]) -> Callable[[], Any]:
    """One seeded ``engine.generate`` call through ``path`` (the same engine and weights for every path)."""
    import torch

    from toolbox.engines import hf
    from toolbox.engines.base import SamplingConfig

    sampling = SamplingConfig(max_new_tokens=case.max_new_tokens, temperature=1.0)
    engine.config = engine.config.model_copy(update={"decode": "generate" if path == "generate" else "lean",
                                                     "forward": "transformers" if path == "lean_transformers" else "auto"})
    # lean_masked: the engine's own lean loop with finished rows kept in the batch (decoding padding).
    loop = functools.partial(hf.decode, drop_finished=path != "lean_masked")

    def call() -> Any:
        if path in ("generate", "lean_transformers"):  # as loaded: the own forward's column-major layout undone
            for module in engine.model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.data = module.weight.data.contiguous()
        torch.manual_seed(0)
        with mock.patch.object(hf, "decode", loop):
            return engine.generate(requests, sampling)

    return call


def run_case(name: str, case: Case, root: Path, rounds: int, repeats: int) -> dict[str, Any]:
    """Time every path of ``case``, alternating, ``rounds`` x ``repeats`` calls each."""
    engine = build_engine(case, root)
    requests = requests_for(case, engine.tokenizer)
    seconds: dict[str, list[float]] = {p: [] for p in PATHS}
    cpu_seconds: dict[str, list[float]] = {p: [] for p in PATHS}
    batches: dict[str, Any] = {}
    for _ in range(rounds):
        for path in PATHS:
            call = path_call(engine, path, case, requests)
            batches[path] = call()  # warm-up, and the tokens compared below
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(repeats):
                call()
            seconds[path].append((time.perf_counter() - start) / repeats)
            cpu_seconds[path].append((time.process_time() - cpu_start) / repeats)
    tokens = int(batches["generate"].response_mask_BR.sum())
    ref = batches["generate"].response_ids_BR
    out: dict[str, Any] = {"case": name, "rows": len(requests), "max_new_tokens": case.max_new_tokens,
                           "tokens_per_call": tokens, "load_avg_1m": os.getloadavg()[0],
                           "same_tokens": all(b.response_ids_BR.shape == ref.shape and bool((b.response_ids_BR == ref).all())
                                              for b in batches.values())}
    for path in PATHS:
        wall, cpu = statistics.median(seconds[path]), statistics.median(cpu_seconds[path])
        out[f"{path}_s"], out[f"{path}_cpu_s"] = wall, cpu
        out[f"{path}_tokens_per_s"] = tokens / wall
        out[f"{path}_speedup"] = statistics.median(seconds["generate"]) / wall
        out[f"{path}_cpu_speedup"] = statistics.median(cpu_seconds["generate"]) / cpu
        out[f"{path}_rounds_s"] = seconds[path]
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench decode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["cases", "smollm2"], default="cases", help="cases: the decode paths on "
                        "--cases; smollm2: SmolLM2-135M-Instruct against the memory bound, bf16 against fp32.")
    parser.add_argument("--cases", default="small,medium,grpo_tiny,medium_eos", help="Comma-separated, of "
                        f"{', '.join(CASES)}.")
    parser.add_argument("--rounds", type=int, default=2, help="Alternating rounds (the median is reported).")
    parser.add_argument("--repeats", type=int, default=None, help="Timed calls per path and round (default 3); "
                        "--model smollm2: per measurement, the best counts (default 2).")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads.")
    parser.add_argument("--models", default="", help="Directory to build/reuse the models in (default: a temp dir).")
    parser.add_argument("--model-path", default="", help="--model smollm2: its directory (default: "
                        "$TOOLBOX_BENCH_SMOLLM2, else the model catalog's smollm2-135m-instruct).")
    parser.add_argument("--batches", default="1,32", help="--model smollm2: decode batch sizes, comma-separated.")
    parser.add_argument("--new-tokens", type=int, default=64, help="--model smollm2: tokens per row (at least 2).")
    parser.add_argument("--bf16-batches", default="1", help="--model smollm2: decode batch sizes of the bf16 variants.")
    parser.add_argument("--dtypes", default="fp32,bf16,bf16t", help="--model smollm2: of fp32, bf16 (toolbox's "
                        "forward) and bf16t (transformers' forward); comma-separated.")
    parser.add_argument("--train-rows", type=int, default=4, help="--model smollm2: rows of the training step "
                        "(the GRPO bench's micro-batch).")
    parser.add_argument("--report", default="", help="--model smollm2: also write the tables as a markdown section "
                        "into this file.")
    parser.add_argument("--out", default="", help="Also write the results as JSON here.")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (2 if args.model == "smollm2" else 3)
    names = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; choose from {sorted(CASES)}")
    args.cases = names
    for flag in ("batches", "bf16_batches"):
        try:
            setattr(args, flag, [int(b) for b in getattr(args, flag).split(",") if b])
        except ValueError:
            parser.error(f"--{flag.replace('_', '-')}: {getattr(args, flag)!r} is not a comma-separated list of integers")
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    if not set(args.dtypes) <= {"fp32", "bf16", "bf16t"} or not args.dtypes:
        parser.error(f"--dtypes: {args.dtypes} must name some of fp32, bf16, bf16t")
    if (not args.batches or not args.bf16_batches or min(args.batches + args.bf16_batches) < 1 or args.new_tokens < 2
            or args.train_rows < 1):
        parser.error("--batches, --bf16-batches, --train-rows must be at least 1 and --new-tokens at least 2 (one "
                     "decode step after the prefill's token)")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.model == "smollm2":
        from toolbox.bench._decode_bound import run

        return run(args, argv)
    import torch
    from rich.console import Console
    from rich.table import Table

    torch.set_num_threads(args.threads)
    root = Path(args.models or tempfile.mkdtemp(prefix="bench-decode-"))
    results = [run_case(n, CASES[n], root, args.rounds, args.repeats) for n in args.cases]
    table = Table(title=f"hf engine decode, {args.threads} thread(s), {args.rounds} rounds x {args.repeats} calls; "
                  "seconds per call (wall / process CPU), speed-up over generate")
    lean_paths = PATHS[1:]
    for col in ("case", "rows x tokens", *(f"{p} s" for p in PATHS), *(f"{p} speed-up" for p in lean_paths),
                "same tokens", "load"):
        table.add_column(col)
    for r in results:
        table.add_row(r["case"], f"{r['rows']} x {r['max_new_tokens']}",
                      *(f"{r[f'{p}_s']:.3f} / {r[f'{p}_cpu_s']:.3f}" for p in PATHS),
                      *(f"{r[f'{p}_speedup']:.2f}x / {r[f'{p}_cpu_speedup']:.2f}x" for p in lean_paths),
                      str(r["same_tokens"]), f"{r['load_avg_1m']:.1f}")
    Console(width=200).print(table)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0
