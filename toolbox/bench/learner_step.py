"""One GRPO learner step padded, packed (``learner.packing``) and packed with shared prompts (``learner.share_prompts``),
on one rank, no Ray.

``python -m toolbox.bench learner_step [--models small,medium,grpo_tiny] [--rounds 3] [--steps 2]``

Each model is a random Qwen2 saved to a temporary directory and loaded by the real
`GRPOLearner` (strategy ``single``, one torch thread, fp32). The rows are what a GRPO step hands a
rank: ``small`` / ``medium`` (the sizes of ``bench grpo --vs trl``) 8 rows of a 8-16 token prompt and a 1-64 token
response (2 prompts x 4 samples, KL off); ``grpo_tiny`` the default experiment's step (16 prompts of 4-5 tokens x 8
samples of 1-4 tokens, one micro-batch of 128, KL on). A group's samples share their prompt, as GRPO's do. The three
sides take turns within each round on the same rows; the table gives each side's best step time and padding
fraction, and the speed-ups over padded rows, in wall time and in this process's CPU time (steadier on a shared
machine: one torch thread).

Not measured here: FSDP2's collectives (the same for both sides), generation, weight sync.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


@dataclass(frozen=True)
class Case:
    """A model's sizes (Qwen2 names) and the rows of one learner step."""

    dims: tuple[int, int, int, int, int]  # hidden, layers, heads, kv heads, mlp
    vocab: int
    rows: int
    group: int
    prompt: tuple[int, int]  # shortest, longest
    response: tuple[int, int]
    micro_batch: int
    kl_coef: float


CASES = {
    "small": Case((256, 4, 4, 2, 1024), 512, 8, 4, (8, 16), (1, 64), 8, 0.0),
    "medium": Case((512, 8, 8, 4, 1536), 512, 8, 4, (8, 16), (1, 64), 8, 0.0),
    "grpo_tiny": Case((64, 2, 4, 2, 256), 20, 128, 8, (4, 5), (1, 4), 128, 0.05),
}


def save_model(case: Case, path: str) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv, mlp = case.dims
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=case.vocab, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=mlp,
                         max_position_embeddings=512, pad_token_id=0)
    Qwen2ForCausalLM(config).save_pretrained(path)


def step_rows(case: Case, seed: int) -> tuple[RolloutBatch, RewardResult]:
    """A GRPO step's rows: each group's samples share a left-padded prompt of random length, responses of random
    lengths (right-padded); rewards alternating 1 / 0."""
    gen = torch.Generator().manual_seed(seed)
    (p_lo, p_hi), (r_lo, r_hi), b = case.prompt, case.response, case.rows
    p = torch.randint(p_lo, p_hi + 1, (b // case.group,), generator=gen).repeat_interleave(case.group)
    r = torch.randint(r_lo, r_hi + 1, (b,), generator=gen)
    pm, rm = (torch.arange(p_hi) >= p_hi - p[:, None]).long(), (torch.arange(r_hi) < r[:, None]).long()
    prompts = torch.randint(1, case.vocab, (b // case.group, p_hi), generator=gen).repeat_interleave(case.group, 0)
    batch = RolloutBatch(prompts * pm, pm,
                         torch.randint(1, case.vocab, (b, r_hi), generator=gen) * rm, rm, torch.zeros(b, r_hi),
                         torch.arange(b) // case.group, torch.zeros(b, dtype=torch.long))
    values = (torch.arange(b) % 2).float()
    return batch, RewardResult(values, torch.zeros(b, dtype=torch.long), [""] * b)


SIDES = {"padded": (False, False), "packed": (True, False), "shared": (True, True)}  # (packing, share_prompts)


def make_learner(case: Case, path: str, packing: bool, share_prompts: bool) -> Any:
    from toolbox.algorithms.grpo.config import GRPOConfig
    from toolbox.algorithms.grpo.learner import GRPOLearner
    from toolbox.learner.config import LearnerConfig

    cfg = LearnerConfig(num_workers=1, strategy="single", device="cpu", micro_batch_size=case.micro_batch,
                        packing=packing, share_prompts=share_prompts, optim={"lr": 1e-4, "scheduler": "constant"})
    algo = GRPOConfig(prompts_per_step=case.rows // case.group, group_size=case.group, kl_coef=case.kl_coef)
    return GRPOLearner(path, "float32", cfg, algo, total_steps=1000)


def measure(name: str, rounds: int, steps: int) -> dict[str, float]:
    """Best step seconds (wall and CPU) of each side (`SIDES`) over ``rounds`` x ``steps`` steps, the sides taking
    turns within each round on the same rows, and their padding fractions."""
    case = CASES[name]
    with tempfile.TemporaryDirectory() as path:
        save_model(case, path)
        learners = {side: make_learner(case, path, *flags) for side, flags in SIDES.items()}
    batch, rewards = step_rows(case, seed=0)
    out: dict[str, float] = {}
    for side in SIDES:
        out[f"{side}_s"] = out[f"{side}_cpu_s"] = float("inf")
    for _ in range(rounds):
        for side, learner in learners.items():
            for _ in range(steps):
                plan = learner.plan([batch], [rewards])
                t0, c0 = time.perf_counter(), time.process_time()
                metrics = learner.update(plan, {0: batch})
                out[f"{side}_s"] = min(out[f"{side}_s"], time.perf_counter() - t0)
                out[f"{side}_cpu_s"] = min(out[f"{side}_cpu_s"], time.process_time() - c0)
                out[f"pad_frac_{side}"] = metrics["pad_frac"]
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench learner_step", description=__doc__)
    parser.add_argument("--models", default="small,medium,grpo_tiny", help=f"Comma-separated, of {sorted(CASES)}.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds; each runs both sides in turn (>= 2).")
    parser.add_argument("--steps", type=int, default=2, help="Timed steps of each side per round.")
    parser.add_argument("--out", default="", help="Also write the results as JSON here.")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    torch.set_num_threads(1)
    rows = {name: measure(name, args.rounds, args.steps) for name in args.models.split(",")}
    table = Table(title=f"GRPO learner step, one rank, 1 thread (load average {os.getloadavg()[0]:.1f})")
    for col in ("model", *(f"{side} s" for side in SIDES), "padded / packed", "padded / shared",
                *(f"CPU s {side}" for side in SIDES), "CPU padded / shared", *(f"pad frac {side}" for side in SIDES)):
        table.add_column(col, justify="right")
    for name, r in rows.items():
        table.add_row(name, *(f"{r[f'{side}_s']:.4f}" for side in SIDES), f"{r['padded_s'] / r['packed_s']:.2f}x",
                      f"{r['padded_s'] / r['shared_s']:.2f}x", *(f"{r[f'{side}_cpu_s']:.4f}" for side in SIDES),
                      f"{r['padded_cpu_s'] / r['shared_cpu_s']:.2f}x", *(f"{r[f'pad_frac_{side}']:.2f}" for side in SIDES))
    Console().print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0
