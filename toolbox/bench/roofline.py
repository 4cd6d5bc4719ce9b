"""GRPO against its roofline: a step's time beside the least time its work could take on this machine.

``python -m toolbox.bench roofline [--models medium,smollm2] [--steps 8] [--warmup 2] [--new-tokens 64]
[--gemm 2048] [--report PATH] [overrides ...]``

In one invocation: this machine's roofs, measured on all its cores (a 512 MiB memcpy for the bandwidth, read plus
written bytes, `toolbox.bench._decode_bound.memcpy_bytes_per_s`; a square fp32 GEMM of ``--gemm`` and a bf16 one,
the faster being the compute roof); then, per model, the GRPO run of ``bench grpo --vs trl`` (the same workload
and 2-core settings, `toolbox.bench._grpo_vs_trl`) for ``--warmup`` + ``--steps`` steps, its phases as the
workers time them (generate, score, train, sync) beside their bounds (`toolbox.bench._roofline`: what each phase
must read and compute). ``medium`` is the random 25M-parameter Qwen2 (`toolbox.bench._bpe_models`), ``smollm2``
SmolLM2-135M-Instruct from the model catalog (skipped, saying so, when it is not there), ``small`` the 4M one.

The fraction is bound over measured time (1.0: at the roof); the last lines are ``MODEL roofline fraction X.XX``,
the whole step's, against the faster GEMM roof, then in parentheses against the fp32 one: the roof of a run that
computes in fp32 (``learner.mixed_precision: fp32`` and an fp32 engine, the defaults on a CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from statistics import fmean
from typing import Any

from toolbox.bench._roofline import Machine, ModelSize, StepWork, bounds, fractions

PHASES = {"generate": "generate_s", "score": "reward_s", "train": "train_s", "sync": "sync_s"}


def gemm_flops_per_s(n: int, dtype: str, repeats: int = 3) -> float:
    """Best FLOPs a second of an ``n`` x ``n`` by ``n`` x ``n`` matrix product in ``dtype`` on torch's threads."""
    import torch

    from toolbox.bench._decode_bound import best_seconds

    a, b = (torch.randn(n, n).to(getattr(torch, dtype)) for _ in range(2))
    return 2.0 * n**3 / best_seconds(lambda: a @ b, repeats)


def measure_machine(gemm: int) -> dict[str, float]:
    """Bandwidth and GEMM throughput on every core (the roofs of a run whose roles share them)."""
    import torch

    from toolbox.bench._decode_bound import memcpy_bytes_per_s

    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        fp32 = gemm_flops_per_s(gemm, "float32")
        bf16 = gemm_flops_per_s(gemm // 2, "bfloat16")  # a smaller one: bf16 may be many times slower on a CPU
        return {"bytes_per_s": memcpy_bytes_per_s(), "gemm_fp32": fp32, "gemm_bf16": bf16, "cores": os.cpu_count() or 1}
    finally:
        torch.set_num_threads(threads)


def model_size(model_dir: str) -> ModelSize:
    """Parameters, layers, attention width and decode traffic of the model in ``model_dir`` (fp32, as trained)."""
    from toolbox.bench._decode_bound import traffic_model
    from toolbox.models.loading import load_causal_lm

    model = load_causal_lm(model_dir, "float32")
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelSize(sum(p.numel() for p in model.parameters()), cfg.num_hidden_layers,
                     cfg.num_attention_heads * head_dim, traffic_model(model))


def step_work(history: list[dict[str, float]], size: ModelSize, steps_per_generation: int,
              micro_batch: int) -> StepWork:
    """A timed step's work (means over ``history``): rows and tokens from the step's counts, the decode batch of a
    block of ``steps_per_generation`` steps, one weight sync a block."""
    rows = fmean(m["samples"] for m in history)
    sampled, trained = fmean(m["sampled_tokens"] for m in history), fmean(m["train_tokens"] for m in history)
    return StepWork(rows=round(rows), prompt_len=(trained - sampled) / rows, new_tokens=sampled / rows,
                    rows_per_call=round(rows) * steps_per_generation, train_tokens=trained,
                    train_seq_len=fmean(m["train_seq_len"] for m in history),
                    micro_batches=math.ceil(rows / micro_batch),
                    sync_bytes=size.traffic.weight_bytes / steps_per_generation)


def run_model(name: str, args: argparse.Namespace, machine: Machine, fp32: Machine,
              root: str) -> dict[str, Any] | None:
    """One model's GRPO run against its bounds; ``None`` (said) when SmolLM2 is not on this machine."""
    from toolbox.bench._grpo_run import run_experiment
    from toolbox.bench._grpo_vs_trl import BEST_2CPU, toolbox_overrides, workload
    from toolbox.config import load_config

    try:
        work = workload(name, root, args.new_tokens)
    except SystemExit as err:
        print(f"{name}: skipped ({err})")
        return None
    overrides = toolbox_overrides(work, [*BEST_2CPU, *args.overrides])
    cfg = load_config(overrides)
    run = run_experiment(overrides, args.steps, args.warmup)
    timed = run.history[args.warmup :]
    size = model_size(work.model_dir)
    steps_per_call = cfg.rollout.steps_per_generation
    work_step = step_work(timed, size, steps_per_call, cfg.learner.micro_batch_size)
    bound, bound_fp32 = bounds(machine, size, work_step), bounds(fp32, size, work_step)
    # A sync happens once a block: its seconds (the step waiting for it reports them) shared by the block's steps.
    measured = {phase: fmean(m[key] for m in timed) for phase, key in PHASES.items()}
    measured["step"] = fmean(m["step_time_s"] for m in timed)
    profiled = profile_phases(work.model_dir, work_step, cfg.rollout.torch_threads,
                              cfg.learner.torch_threads) if args.profile else {}
    return {"model": name, "params": size.params, "weight_bytes": size.traffic.weight_bytes, "profile": profiled,
            "work": vars(work_step), "measured_s": measured, "bound_s": bound,
            "fraction": fractions(bound, measured), "fraction_fp32": fractions(bound_fp32, measured), "settings": run.settings, "load": os.getloadavg()[0]}


def top_ops(fn: Any, threads: int, count: int = 5) -> list[list[str]]:
    """``fn`` run once untimed, then once under ``torch.profiler`` on ``threads`` threads: its ``count`` ops of most
    self CPU time, each as (op, share of the profiled time, calls)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        torch.set_num_threads(before)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [[e.key, f"{e.self_cpu_time_total / total:.0%}", str(e.count)] for e in events[:count]]


def profile_phases(model_dir: str, work: StepWork, rollout_threads: int, learner_threads: int) -> dict[str, Any]:
    """Where a step's generation and training go, in this process: the engine decoding ``rows_per_call`` rows of
    the run's lengths (random prompt ids) on the rollout worker's threads, and one forward and backward of the
    response log-probs of those rows (one micro-batch) on the learner's."""
    import torch

    from toolbox.engines.base import SamplingConfig
    from toolbox.engines.hf import HFEngine
    from toolbox.models.loading import load_causal_lm
    from toolbox.models.logprobs import response_logprobs
    from toolbox.rl.batch import PromptRequest

    engine = HFEngine(model_dir, "float32")
    gen = torch.Generator().manual_seed(0)
    vocab = int(engine.model.config.vocab_size)
    prompt = max(1, round(work.prompt_len))
    requests = [PromptRequest(torch.randint(3, vocab, (prompt,), generator=gen).tolist(), i // 4)
                for i in range(work.rows_per_call)]
    sampling = SamplingConfig(max_new_tokens=round(work.new_tokens), stop_at_eos=False)
    rows = engine.generate(requests[: work.rows], sampling)
    model = load_causal_lm(model_dir, "float32").train()

    def train() -> None:
        model.zero_grad(set_to_none=True)
        logp = response_logprobs(model, rows, 1.0)
        (-logp.sum() / rows.response_mask_BR.sum()).backward()

    return {"generate": top_ops(lambda: engine.generate(requests, sampling), rollout_threads),
            "train": top_ops(train, learner_threads)}


def tables(machine: dict[str, float], results: list[dict[str, Any]]) -> list[Any]:
    """The roofs, then per model its phases against their bounds and, when profiled, where generate and train go."""
    from toolbox.bench._report import Table

    out = [Table("this machine's roofs (all cores)", ["roof", "value"],
                 [["memcpy bandwidth (read + write)", f"{machine['bytes_per_s'] / 1e9:.1f} GB/s"],
                  ["fp32 GEMM", f"{machine['gemm_fp32'] / 1e9:.1f} GFLOP/s"],
                  ["bf16 GEMM", f"{machine['gemm_bf16'] / 1e9:.1f} GFLOP/s"]])]
    for r in results:
        rows = []
        for phase in (*PHASES, "step"):
            frac = r["fraction"].get(phase)
            unmeasured = "no roof" if not r["bound_s"].get(phase) else "not timed"  # a sync no step waited for
            rows.append([phase, f"{r['measured_s'][phase]:.4f}", f"{r['bound_s'][phase]:.4f}",
                         unmeasured if frac is None else f"{frac:.2f}", _fraction(r["fraction_fp32"].get(phase))])
        w = r["work"]
        out.append(Table(f"{r['model']} ({r['params'] / 1e6:.1f}M parameters): GRPO step against its roofline, "
                         f"{w['rows']} rows x {w['new_tokens']:.0f} new tokens after {w['prompt_len']:.0f} prompt "
                         f"tokens, decode batch {w['rows_per_call']}; {r['settings']}",
                         ["phase", "measured s a step", "bound s a step", "fraction", "of the fp32 roof"], rows))
        out += [Table(f"{r['model']}: where {phase} goes (torch.profiler, one engine call / one micro-batch, self "
                      "CPU time)", ["op", "share", "calls"], ops) for phase, ops in r["profile"].items()]
    return out


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench roofline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="medium,smollm2", help="Comma-separated: small, medium, smollm2.")
    parser.add_argument("--steps", type=int, default=8, help="Timed steps per model (two blocks of 4: each has a sync).")
    parser.add_argument("--warmup", type=int, default=2, help="Untimed steps first.")
    parser.add_argument("--new-tokens", type=int, default=64, help="Tokens per completion.")
    parser.add_argument("--gemm", type=int, default=2048, help="Side of the fp32 GEMM (bf16: half of it).")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="Skip the in-process profile "
                        "of one engine call and one training micro-batch after each model's run.")
    parser.add_argument("--out", default="", help="Also write the results as JSON here.")
    parser.add_argument("--report", default="", help="Also write the tables as a markdown section into this file.")
    parser.add_argument("overrides", nargs="*", help="Config overrides on top of the benchmark's settings.")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    from toolbox.bench._report import command_line, print_tables, section, write_section

    args = parse(argv)
    roofs = measure_machine(args.gemm)
    machine = Machine(roofs["bytes_per_s"], max(roofs["gemm_fp32"], roofs["gemm_bf16"]))
    fp32 = Machine(roofs["bytes_per_s"], roofs["gemm_fp32"])  # the roof of a run that computes in fp32
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-roofline-") as root:
        for name in args.models.split(","):
            started = time.perf_counter()
            result = run_model(name, args, machine, fp32, root)
            if result is not None:
                results.append({**result, "seconds": time.perf_counter() - started})
    shown = tables(roofs, results)
    lines = [f"{r['model']} roofline fraction {r['fraction']['step']:.2f} (of the fp32 roof: "
             f"{_fraction(r['fraction_fp32']['step'])})" for r in results]
    print_tables(shown, [f"load average {os.getloadavg()[0]:.1f}", *lines])
    if args.report:
        write_section(args.report, section("GRPO against its roofline", shown, lines, command_line("roofline", argv)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": roofs, "models": results}, f, indent=2)
    return 0
