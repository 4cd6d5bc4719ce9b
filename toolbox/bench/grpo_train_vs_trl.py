"""One GRPO training step on identical rows: toolbox's learner now, as it was, and TRL's recipe; CPU time, no Ray.

``python -m toolbox.bench grpo_train_vs_trl [--models small,medium] [--rounds 3] [--threads 1] [--short 64]``

The rows are those of ``bench grpo --vs trl``: 2 prompts x 4 samples, prompts of 8-16 tokens, responses of
``--short``-64 tokens (64: every completion exactly 64 tokens, as that benchmark samples them), KL off, one
micro-batch of 8. Three sides, alternating within each round, each its best of the rounds in this process's
CPU seconds (all threads; steadier than wall time on a shared machine):

- ``toolbox``: `GRPOLearner` with the benchmark's learner settings (``single``, ``packing`` on, AdamW
  ``kernel: auto``, i.e. fused).
- ``toolbox_before``: the same without two levers, to show what each is worth: the per-tensor AdamW loop
  (``kernel: for_loop``) and packing every micro-batch however little padding it has
  (`toolbox.learner.packed.PACK_BELOW` lifted).
- ``trl_style``: TRL's ``GRPOTrainer`` step reduced to its arithmetic, written here (TRL's trainer cannot be
  handed rows): the padded prompt + completion rows forwarded with ``logits_to_keep`` = completion length + 1,
  the completion tokens' log-softmax, the clipped surrogate averaged over tokens, backward, gradient clip 1.0,
  fused AdamW (what transformers' Trainer builds with torch >= 2.8).

Not measured: generation, weight sync, Ray calls (see ``bench grpo --vs trl`` for the whole step).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from toolbox.bench.learner_step import CASES, Case, save_model, step_rows

SIDES = ("toolbox", "toolbox_before", "trl_style")


def bench_case(name: str, short: int) -> Case:
    """``bench grpo --vs trl``'s rows on model ``name``: responses of ``short``-64 tokens."""
    base = CASES[name]
    return Case(base.dims, base.vocab, 8, 4, (8, 16), (short, 64), 8, 0.0)


def _learner(path: str, kernel: str) -> Any:
    from toolbox.algorithms.grpo.config import GRPOConfig
    from toolbox.algorithms.grpo.learner import GRPOLearner
    from toolbox.learner.config import LearnerConfig

    cfg = LearnerConfig(num_workers=1, strategy="single", device="cpu", micro_batch_size=8, packing=True,
                        optim={"lr": 1e-4, "scheduler": "constant", "kernel": kernel})
    return GRPOLearner(path, "float32", cfg, GRPOConfig(prompts_per_step=2, group_size=4, kl_coef=0.0), 1000)


def _toolbox_step(learner: Any, batch: Any, rewards: Any, pack_always: bool) -> Callable[[], None]:
    from toolbox.learner import packed

    def step() -> None:
        saved = packed.PACK_BELOW
        packed.PACK_BELOW = float("inf") if pack_always else saved
        try:
            learner.update(learner.plan([batch], [rewards]), {0: batch})
        finally:
            packed.PACK_BELOW = saved

    return step


def _trl_step(path: str, batch: Any) -> Callable[[], None]:
    from transformers import AutoModelForCausalLM

    from toolbox.models.logprobs import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(path).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    ids = torch.cat([batch.prompt_ids_BP, batch.response_ids_BR], 1)
    attention = torch.cat([batch.prompt_mask_BP, batch.response_mask_BR], 1)
    mask, width = batch.response_mask_BR, batch.response_ids_BR.shape[1]
    adv_B1 = ((torch.arange(len(batch)) % 2).float() - 0.5).unsqueeze(1)

    def step() -> None:
        logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=width + 1).logits[:, :-1]
        logp = token_logprobs(logits, batch.response_ids_BR)
        ratio = torch.exp(logp - logp.detach())
        surrogate = torch.min(ratio * adv_B1, ratio.clamp(0.8, 1.2) * adv_B1)
        (-(surrogate * mask).sum() / mask.sum()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def measure(name: str, rounds: int, short: int = 64) -> dict[str, float]:
    """Each side's best CPU seconds per step over ``rounds`` alternating rounds (after one untimed step each)."""
    case = bench_case(name, short)
    batch, rewards = step_rows(case, seed=0)
    with tempfile.TemporaryDirectory() as path:
        save_model(case, path)
        steps = {"toolbox": _toolbox_step(_learner(path, "auto"), batch, rewards, pack_always=False),
                 "toolbox_before": _toolbox_step(_learner(path, "for_loop"), batch, rewards, pack_always=True),
                 "trl_style": _trl_step(path, batch)}
    best = dict.fromkeys(SIDES, float("inf"))
    for step in steps.values():
        step()  # warm-up: allocator, lazy inits
    for _ in range(rounds):
        for side, step in steps.items():
            start = time.process_time()
            step()
            best[side] = min(best[side], time.process_time() - start)
    return {**{f"{side}_cpu_s": best[side] for side in SIDES},
            "toolbox_vs_before": best["toolbox_before"] / best["toolbox"],
            "toolbox_vs_trl_style": best["trl_style"] / best["toolbox"]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench grpo_train_vs_trl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="small,medium", help="Comma-separated, of small, medium.")
    parser.add_argument("--rounds", type=int, default=3, help="Timed rounds, each side once per round.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads.")
    parser.add_argument("--short", type=int, default=64, help="Shortest response (tokens, 1-64; 64: all full).")
    args = parser.parse_args(argv)
    if not 1 <= args.short <= 64 or args.rounds < 1:
        parser.error("--short must be 1-64 and --rounds at least 1")
    torch.set_num_threads(args.threads)
    print(f"GRPO train step, CPU s (best of {args.rounds}), {args.threads} thread(s), responses {args.short}-64 "
          f"tokens, load average {os.getloadavg()[0]:.1f}")
    print(f"{'model':<8} {'toolbox':>8} {'before':>8} {'TRL-style':>10} {'before/now':>11} {'TRL/toolbox':>12}")
    for name in args.models.split(","):
        r = measure(name, args.rounds, args.short)
        print(f"{name:<8} {r['toolbox_cpu_s']:>8.3f} {r['toolbox_before_cpu_s']:>8.3f} {r['trl_style_cpu_s']:>10.3f} "
              f"{r['toolbox_vs_before']:>10.2f}x {r['toolbox_vs_trl_style']:>11.2f}x", flush=True)
    return 0
