"""SmolLM2 on this CPU: decode tokens/s against the memory-bandwidth bound, and bf16 against fp32 per role.

``python -m toolbox.bench decode --model smollm2 [--batches 1,32] [--bf16-batches 1] [--new-tokens 64] [--repeats 2]
[--threads 1] [--dtypes fp32,bf16,bf16t]``

**Decode against the bound.** A decode step reads every weight once (the tied embedding as the output head) and
the KV cache of every row up to its position; at small batches that traffic, not arithmetic, sets the speed. The
bound is ``bytes read per step / bandwidth``, the bandwidth measured in the same run as a large ``memcpy``
(``Tensor.copy_`` of 512 MiB on the same threads; read plus written bytes over the time, the best of 5), so the
fraction ``measured / bound tokens/s`` says how much of the memory system the engine uses. Decode time is
separated from prefill: ``(generate(N tokens) - generate(1 token)) / (N - 1)`` per step, best of ``--repeats``
each, the ``hf`` engine's lean loop (toolbox's own forward) on chat-templated arithmetic prompts, every row run to
``N`` tokens (``stop_at_eos`` off). KV bytes use the mean context of the decode steps (left-padded prompt + N/2).
Not counted: activations, logits (B x 49,152 floats a step, 1% of the weights at batch 32), cache misses on
re-read data; so a fraction above 1 means the bandwidth figure, not the bound arithmetic, is off.

**bf16 against fp32.** The same generate calls with the model loaded in bfloat16 (``bf16``: toolbox's own forward,
column-major weights as for fp32; ``bf16t``: transformers' forward on row-major weights), at ``--bf16-batches``
(bf16 decodes 10-80x slower here, so batch 32 would take the better part of an hour), and one training micro-batch
(forward + backward of the response log-probs, the learner's own `response_logprobs`, ``--train-rows`` rows of
a prompt and ``N`` response tokens) in each dtype, best of ``--repeats``. On a CPU without AMX or AVX512-BF16,
bf16 matrix products convert to fp32 and back, so bf16 halves the bytes but may not save time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolbox.bench._report import Table, command_line, print_tables, section, write_section

MIB = 2**20
# Name -> (model dtype, the lean loop's forward). bf16t runs transformers' forward, whose weights stay row-major:
# toolbox's own forward stores them column-major, which MKL's fp32 GEMM reads faster and this CPU's bf16 kernels
# (no AVX512-BF16, no AMX) far slower.
DTYPES = {"fp32": ("float32", "auto"), "bf16": ("bfloat16", "auto"), "bf16t": ("bfloat16", "transformers")}


@dataclass(frozen=True)
class TrafficModel:
    """Bytes a decode step reads: every weight once, and per row the K and V of every context position."""

    weight_bytes: int
    kv_bytes_per_position: int  # K and V, all layers, one row

    def step_bytes(self, batch: int, context: float) -> float:
        return self.weight_bytes + batch * context * self.kv_bytes_per_position

    def bound_tokens_per_s(self, batch: int, context: float, bytes_per_s: float) -> float:
        """Tokens/s if a step took exactly its bytes' time at ``bytes_per_s``: ``batch`` tokens a step."""
        return batch * bytes_per_s / self.step_bytes(batch, context)


def traffic_model(model: Any) -> TrafficModel:
    """The `TrafficModel` of a loaded causal LM: its distinct parameters (tied ones once) in their dtype, and its
    KV cache entry per position (grouped-query heads: ``num_key_value_heads`` of ``head_dim``)."""
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied weight is listed once
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    element = next(model.parameters()).element_size()
    return TrafficModel(weight_bytes, 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * element)


def mean_context(prompt_len: int, new_tokens: int) -> float:
    """Mean number of cached positions over decode steps 1..N-1 (step j attends to prompt + j positions)."""
    return prompt_len + new_tokens / 2


def memcpy_bytes_per_s(mib: int = 512, repeats: int = 5) -> float:
    """Best bandwidth of copying ``mib`` MiB (read + written bytes over the time) on torch's current threads."""
    import torch

    src = torch.ones(mib * MIB // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # pages faulted in before timing
    best = min(_seconds(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * src.numel() * src.element_size() / best


def _seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of ``repeats`` calls after one untimed warm-up call (the least disturbed on a shared machine)."""
    fn()
    return min(_seconds(fn) for _ in range(repeats))


def prompts(model_dir: str, count: int) -> list[Any]:
    """``count`` distinct chat-templated arithmetic prompts (the GRPO bench's task), one request each."""
    from toolbox.bench._smollm2 import arith_task
    from toolbox.data.tasks import TASKS
    from toolbox.models.loading import load_tokenizer
    from toolbox.rl.batch import PromptRequest

    task, tok = TASKS.build(arith_task()), load_tokenizer(model_dir)
    problems = list(task.train_problems())[:count]
    return [PromptRequest(task.prompt_ids(p, tok), g, {"answer": p.answer}) for g, p in enumerate(problems)]


def decode_row(engine: Any, requests: list[Any], new_tokens: int, repeats: int, bytes_per_s: float) -> dict[str, Any]:
    """One batch on one engine: whole-call seconds, decode tokens/s (prefill taken out), its bound and fraction."""
    from toolbox.engines.base import SamplingConfig

    def call(n: int) -> Callable[[], Any]:
        sampling = SamplingConfig(max_new_tokens=n, temperature=1.0, stop_at_eos=False)
        return lambda: engine.generate(requests, sampling)

    full, first = best_seconds(call(new_tokens), repeats), best_seconds(call(1), repeats)
    batch, prompt_len = len(requests), max(len(r.ids) for r in requests)
    measured = batch * (new_tokens - 1) / max(full - first, 1e-9)
    bound = traffic_model(engine.model).bound_tokens_per_s(batch, mean_context(prompt_len, new_tokens), bytes_per_s)
    return {"batch": batch, "prompt_len": prompt_len, "call_s": full, "prefill_s": first,
            "decode_tokens_per_s": measured, "bound_tokens_per_s": bound, "fraction": measured / bound}


def train_seconds(model_dir: str, dtype: str, rows: Any, repeats: int) -> float:
    """Best forward + backward of the response log-probs of ``rows`` (a `RolloutBatch`) with the model in ``dtype``."""
    from toolbox.models.loading import load_causal_lm
    from toolbox.models.logprobs import response_logprobs

    model = load_causal_lm(model_dir, dtype).train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logp = response_logprobs(model, rows, 1.0)
        (-logp.sum() / rows.response_mask_BR.sum()).backward()

    return best_seconds(step, repeats)


def measure(model_dir: str, dtypes: list[str], batches: dict[str, list[int]], new_tokens: int, repeats: int,
            train_rows: int) -> dict[str, Any]:
    """Bandwidth, then per dtype: a decode row per batch of ``batches[dtype]`` and, once per model dtype, one
    training step's seconds."""
    from toolbox.engines.base import SamplingConfig
    from toolbox.engines.hf import HFEngine, HFEngineConfig

    bandwidth = memcpy_bytes_per_s()
    requests = prompts(model_dir, max(max(max(b) for b in batches.values()), train_rows))
    out: dict[str, Any] = {"memcpy_gb_per_s": bandwidth / 1e9, "new_tokens": new_tokens, "decode": [], "train_s": {},
                           "weight_bytes": {}}
    rows: Any = None
    trained: dict[str, float] = {}
    for name in dtypes:
        dtype, forward = DTYPES[name]
        engine = HFEngine(model_dir, dtype, HFEngineConfig(forward=forward))
        out["weight_bytes"][name] = traffic_model(engine.model).weight_bytes
        for batch in batches[name]:
            out["decode"].append({"dtype": name, **decode_row(engine, requests[:batch], new_tokens, repeats, bandwidth)})
        if rows is None:  # one set of rows for every dtype's training step: the first engine's samples
            rows = engine.generate(requests[:train_rows], SamplingConfig(max_new_tokens=new_tokens, stop_at_eos=False))
        del engine
        if dtype not in trained:  # training has no lean-loop forward: once per model dtype
            trained[dtype] = train_seconds(model_dir, dtype, rows, repeats)
            out["train_s"][name] = trained[dtype]
    out["train_rows"], out["train_tokens"] = train_rows, int(rows.prompt_ids_BP.numel() + rows.response_ids_BR.numel())
    return out


def ratio_rows(result: dict[str, Any], base: str = "fp32") -> list[list[str]]:
    """Per role and variant: ``base`` (fp32) and the variant's seconds, their ratio (variant over fp32) and which is
    faster, at every batch both decoded."""
    def cells(role: str, name: str, a: float, b: float) -> list[str]:
        return [role, name, f"{a:.3f}", f"{b:.3f}", f"{b / a:.2f}", base if a < b else name]

    out = []
    variants = list(dict.fromkeys(d["dtype"] for d in result["decode"] if d["dtype"] != base))
    for batch in sorted({d["batch"] for d in result["decode"]}):
        calls = {d["dtype"]: d["call_s"] for d in result["decode"] if d["batch"] == batch}
        out += [cells(f"generation, batch {batch} x {result['new_tokens']} tokens (s a call)", v, calls[base],
                      calls[v]) for v in variants if base in calls and v in calls]
    train = result["train_s"]
    out += [cells(f"training, {result['train_rows']} rows forward + backward (s)", v, train[base], train[v])
            for v in train if v != base and base in train]
    return out


def tables(result: dict[str, Any], threads: int) -> list[Table]:
    """The decode-vs-bound table and the bf16-vs-fp32 table."""
    decode = Table(f"hf engine decode on SmolLM2-135M-Instruct against the memory-bandwidth bound: memcpy "
                   f"{result['memcpy_gb_per_s']:.1f} GB/s (read + write), {threads} thread(s), {result['new_tokens']} "
                   "new tokens a row, best of the repeats",
                   ["dtype", "batch", "prompt tokens", "call s", "prefill s", "decode tokens/s", "bound tokens/s",
                    "fraction of bound"],
                   [[d["dtype"], str(d["batch"]), str(d["prompt_len"]), f"{d['call_s']:.3f}", f"{d['prefill_s']:.3f}",
                     f"{d['decode_tokens_per_s']:.1f}", f"{d['bound_tokens_per_s']:.1f}", f"{d['fraction']:.0%}"]
                    for d in result["decode"]])
    precision = Table(f"bf16 against fp32 per role, {threads} thread(s), seconds (best of the repeats; bf16t: "
                      "transformers' forward, row-major weights)",
                      ["role", "variant", "fp32", "variant s", "variant / fp32", "faster"], ratio_rows(result))
    return [decode, precision]


def run(args: Any, argv: list[str]) -> int:
    """``toolbox bench decode --model smollm2``: measure, print both tables, write the report and JSON if asked."""
    import json
    from pathlib import Path

    import torch
    from transformers.utils import logging as hf_logging

    from toolbox.bench._smollm2 import model_dir

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    path = model_dir(args.model_path)
    batches = {d: args.batches if d == "fp32" else args.bf16_batches for d in args.dtypes}
    result = measure(path, args.dtypes, batches, args.new_tokens, args.repeats, args.train_rows)
    shown = tables(result, args.threads)
    print_tables(shown)
    if args.report:
        note = (f"Bytes a decode step reads: the weights once ({_weights_note(result)}) plus, per row, K and V of "
                "every cached position; decode tokens/s = rows x (N - 1) / (generate(N) - generate(1)). How the bound "
                "is taken and what it leaves out: `toolbox/bench/_decode_bound.py`.")
        write_section(args.report, section("Decode against the memory bound, bf16 against fp32: smollm2", shown,
                                           [note], command_line("decode", argv), ("torch", "transformers")))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _weights_note(result: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in result.get("weight_bytes", {}).items())
