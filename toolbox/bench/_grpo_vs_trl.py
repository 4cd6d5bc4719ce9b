"""GRPO against TRL: the same models, prompts, reward and hyper-parameters; each side in a fresh process.

``python -m toolbox.bench grpo --vs trl [--model small|medium|both|smollm2] [--rounds 2] [--steps 8] [--out FILE]``

Fairness, point by point:

- **Model and tokenizer**: one directory per model, loaded by both: the random BPE models
  (`toolbox.bench._bpe_models`) or SmolLM2-135M-Instruct (`toolbox.bench._smollm2`).
- **Prompts**: toolbox's own prompt sequence (``PromptSource`` of the model's task, seed 0: digit_add for the
  BPE models, the chat-templated arithmetic problems for SmolLM2) is decoded to text, special tokens kept, and
  given to TRL as an unshuffled dataset, so step k of both sees the same 2 prompts x 4 samples; TRL's
  tokenization of that text is checked to give toolbox's very ids.
- **Reward**: the same registered reward (a ``weighted_sum`` of a correctness and a ``format`` term: `REWARD`,
  or SmolLM2's), called by TRL through a reward function.
- **Length**: every completion is exactly ``--new-tokens`` long on both sides: toolbox samples with
  ``stop_at_eos=false``, TRL with ``min_new_tokens = max_completion_length``. Tokens/s counts the tokens
  each side reports it produced (TRL's ``completion_ids``, toolbox's ``response_len``), so a mismatch would
  show there rather than hide.
- **Optimisation**: fp32, full fine-tune (SmolLM2 with ``--lora``: the recipe's LoRA adapters at lr 5e-4 on both
  sides, built from one peft config; toolbox syncs the adapter alone), KL off (``beta=0``), one PPO epoch, AdamW at
  a constant lr (1e-4 on the random models, 1e-5 on SmolLM2), clip 1.0, temperature 1, top-p 1; the same micro-batch on both sides
  (all 8 rows on the random models, 4 on SmolLM2: TRL accumulates 2 of them per optimizer step).
- **Timing**: only the training steps after ``--warmup`` untimed ones (model load, Ray start-up and the
  first weight sync excluded): TRL from the end of the last warm-up step to the end of the last step,
  toolbox the sum of its ``step_time_s``. Toolbox's start-up is reported separately.
- **Memory**: the peak PSS of each side's whole process tree (TRL's one process; toolbox's driver, Ray
  daemons and actors), sampled once a second (`toolbox.core.memory`).
- **CPU**: the CPU seconds (user + system) of each side's process tree over the timed steps, and
  completions per CPU second: on a shared, loaded machine the steadier figure (it counts the work done,
  not the waiting for cores; it also leaves out a side's own idle waits, which wall time charges).
- **Order**: the sides alternate (who goes first flips each round); the ratio is toolbox's mean
  completions/s over TRL's, rounds of one invocation only.

The time split: TRL's generate and reward are timed by wrapping ``model.generate`` and the reward
function, the rest of its step is "train"; toolbox's phases are timed by the workers (they may overlap).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

PHASES = ("generate_s", "reward_s", "train_s", "sync_s")
TASK = {"name": "digit_add", "max_operand": 99}
# Correct sum (1) plus a shaping term (0.2) for starting with a digit: a random model never gets the sum right,
# and the shaping keeps rewards varying within groups, so advantages are not all zero (real gradient work).
REWARD = {"name": "weighted_sum", "weights": [1.0, 0.2],
          "components": [{"name": "math", "which": "first"}, {"name": "format", "pattern": r"(?s)\d.*"}]}
# toolbox's best settings for a 2-core machine, measured with this benchmark on a quiet machine (docs/benchmarks.md,
# "GRPO against TRL"): one rollout worker with one torch thread, one reward worker and one `single` learner rank
# with two (it takes the second core whenever the rollout worker waits), so generation and training keep both cores
# busy at once: the rollout worker samples ahead
# (`rollout.max_staleness`) in blocks of 4 steps per engine call (`rollout.steps_per_generation`: a decode batch of
# 32 rows costs about twice one of 8 on this CPU, where weights stream from memory per token), the learner trains on
# one step at a time with truncated importance sampling for the lag. max_staleness 7 = 2 x 4 - 1 is the least that
# lets a block be sampled while the block before it is trained on. The micro-batch is the workload's
# (`Workload`), the same on both sides. Without overlap (one actor per role with 2 threads each, each role waiting
# for the other) toolbox reaches 0.81-1.04x TRL. Packing is on, but this benchmark's fixed 64-token
# completions leave too little padding for it to pay (`toolbox.learner.packed.PACK_BELOW`).
BEST_2CPU = ["rollout.num_workers=1", "rollout.torch_threads=1", "reward.num_workers=1", "learner.num_workers=1",
             "learner.strategy=single", "learner.torch_threads=2", "learner.packing=true",
             "rollout.steps_per_generation=4", "rollout.max_staleness=7"]


@dataclass(frozen=True)
class Workload:
    """What one model of the comparison trains on, the same for both sides: its directory, task, reward and sizes
    (``prompts`` x ``group`` completions of ``new_tokens`` per step, ``lr``, ``micro_batch`` rows per forward)."""

    model_dir: str
    task: dict[str, Any] = field(default_factory=lambda: dict(TASK))
    reward: dict[str, Any] = field(default_factory=lambda: dict(REWARD))
    sizes: dict[str, Any] = field(default_factory=dict)


# The grpo_smollm2_arith recipe's adapters and learning rate (`--lora`): a LoRA run on both sides.
SMOLLM2_LORA = {"r": 16, "alpha": 32, "target_modules": "all-linear"}
SMOLLM2_LORA_LR = 5e-4


def workload(model: str, root: str, new_tokens: int, model_path: str = "", lora: bool = False) -> Workload:
    """The workload of ``model``: a random BPE model built under ``root``, or SmolLM2 (``model_path`` or the
    catalog's copy) on the chat-templated arithmetic task, its full weights trained or, with ``lora``, the
    recipe's adapters."""
    sizes = {"prompts": 2, "group": 4, "new_tokens": new_tokens, "lr": 1e-4, "micro_batch": 8}
    if model != "smollm2":
        from toolbox.bench._bpe_models import build_model

        return Workload(build_model(root, model), sizes=sizes)
    from toolbox.bench import _smollm2

    # lr as the smollm2 experiment trains it; micro-batch 4 keeps a 135M model's activations of 4 x ~110 tokens small
    adapters = {"lora": SMOLLM2_LORA, "lr": SMOLLM2_LORA_LR} if lora else {"lr": 1e-5}
    return Workload(_smollm2.model_dir(model_path), _smollm2.arith_task(), _smollm2.REWARD,
                    {**sizes, "micro_batch": 4, **adapters})


def trl_batching(sizes: dict[str, Any]) -> dict[str, int]:
    """TRL's batch settings for toolbox's micro-batch: that many rows per forward, accumulated to one step."""
    rows = sizes["prompts"] * sizes["group"]
    micro = sizes.get("micro_batch", rows)
    if rows % micro:
        raise ValueError(f"micro-batch {micro} must divide the {rows} rows of a step")
    return {"per_device_train_batch_size": micro, "gradient_accumulation_steps": rows // micro}


def trl_lora(sizes: dict[str, Any]) -> Any:
    """The workload's adapters as TRL takes them (a peft ``LoraConfig``, as toolbox builds its own), or None."""
    if not sizes.get("lora"):
        return None
    from toolbox.learner.lora import LoraConfig, peft_config

    return peft_config(LoraConfig.model_validate(sizes["lora"]))


def toolbox_overrides(work: Workload, settings: list[str]) -> list[str]:
    """The GRPO run the benchmark compares, of ``work``, with ``settings`` (parallelism) on top."""
    sizes = work.sizes
    return [f"model.path={work.model_dir}", "model.tiny=null", f"task={json.dumps(work.task)}",
            f"reward.spec={json.dumps(work.reward)}",
            f"rollout.sampling.max_new_tokens={sizes['new_tokens']}", "rollout.sampling.temperature=1.0",
            "rollout.sampling.top_p=1.0", "rollout.sampling.stop_at_eos=false",
            f"algorithm.prompts_per_step={sizes['prompts']}", f"algorithm.group_size={sizes['group']}",
            "algorithm.kl_coef=0.0", f"learner.optim.lr={sizes['lr']}", "learner.optim.scheduler=constant",
            "learner.optim.warmup_steps=0",
            f"learner.micro_batch_size={sizes.get('micro_batch', sizes['prompts'] * sizes['group'])}",
            *([f"learner.lora={json.dumps({**sizes['lora'], 'sync': 'adapter'})}"] if sizes.get("lora") else []),
            "trainer.seed=0", *settings]


def prompt_rows(model_dir: str, sizes: dict[str, Any], steps: int, task: dict[str, Any] | None = None,
                seed: int = 0) -> list[dict[str, str]]:
    """Every step's prompts as toolbox draws them (one row per group) from ``task`` (default `TASK`) with ``seed``,
    decoded to text for TRL, special tokens (a chat template's) kept. Raises when TRL's tokenization of a text
    (the tokenizer's defaults) would not give toolbox's ids back."""
    from toolbox.data.prompts import PromptSource
    from toolbox.data.tasks import TASKS
    from toolbox.models.loading import load_tokenizer

    tok = load_tokenizer(model_dir)
    source = PromptSource(TASKS.build(task or TASK), tok, seed=seed)
    rows = []
    for step in range(steps):
        requests = source.step(step, sizes["prompts"], sizes["group"])
        for first in requests[:: sizes["group"]]:
            text = tok.decode(first.ids, skip_special_tokens=False)
            if list(tok(text)["input_ids"]) != list(first.ids):
                raise ValueError(f"bench grpo: prompt {text!r} of step {step} does not re-tokenize to toolbox's ids, "
                                 "so TRL would see other prompts")
            rows.append({"prompt": text, "answer": first.extras["answer"]})
    return rows


def summarize(step_s: list[float], phases: dict[str, list[float]], completions_per_step: int,
              tokens: float, cpu_s: float | None = None) -> dict[str, float]:
    """Throughput and mean per-step time split of the timed steps: ``step_s`` their durations, ``phases`` each
    phase's seconds per step, ``tokens`` the completion tokens they produced, ``cpu_s`` the CPU seconds the
    side's process tree used meanwhile. ``other_s`` is what the phases leave of a step (negative when they
    overlap)."""
    total = sum(step_s)
    if not step_s or total <= 0:
        raise ValueError("no timed steps to summarize (is --steps at least 1?)")
    out = {"steps": float(len(step_s)), "completions_per_s": completions_per_step * len(step_s) / total,
           "tokens_per_s": tokens / total, "step_s": total / len(step_s)}
    for name in PHASES:
        out[name] = fmean(phases[name]) if phases.get(name) else 0.0
    out["other_s"] = out["step_s"] - sum(out[p] for p in PHASES)
    if cpu_s is not None:
        out["cpu_s"] = cpu_s / len(step_s)
        out["completions_per_cpu_s"] = completions_per_step * len(step_s) / cpu_s
    return out


def window(marks: list[float], warmup: int) -> float | None:
    """``marks[-1] - marks[warmup - 1]``: a counter's growth over the steps after warm-up (None without marks)."""
    if warmup < 1 or len(marks) <= warmup:
        return None
    return marks[-1] - marks[warmup - 1]


def trl_summary(raw: dict[str, Any], warmup: int, completions_per_step: int) -> dict[str, float]:
    """`summarize` of a TRL run's step ends, wrapped phase timings and completion lengths."""
    ends = raw["ends"]
    if warmup < 1 or len(ends) <= warmup:
        raise ValueError(f"TRL ran {len(ends)} steps; the benchmark needs at least one warm-up and one timed step")
    step_s = [b - a for a, b in zip(ends[warmup - 1 : -1], ends[warmup:])]
    phases = {k: v[warmup:] for k, v in raw["phases"].items()}
    phases["train_s"] = [s - sum(v[i] for v in phases.values()) for i, s in enumerate(step_s)]
    tokens = float(sum(raw["tokens"][warmup * completions_per_step :]))
    return {**summarize(step_s, phases, completions_per_step, tokens, window(raw.get("cpu", []), warmup)),
            "peak_pss_mib": raw["peak_pss_mib"]}


def toolbox_summary(history: list[dict[str, float]], warmup: int, rows_per_step: int,
                    step_cpu_s: list[float] | None = None) -> dict[str, float]:
    """`summarize` of toolbox's step metrics (``step_time_s``, worker-timed phases, ``response_len``) and the
    process tree's CPU seconds at each step's end."""
    timed = history[warmup:]
    phases = {p: [m.get(p, 0.0) for m in timed] for p in PHASES}
    tokens = sum(m["response_len"] * rows_per_step for m in timed)
    return summarize([m["step_time_s"] for m in timed], phases, rows_per_step, tokens,
                     window(step_cpu_s or [], warmup))


def ratio(toolbox: list[dict[str, float]], trl: list[dict[str, float]], key: str = "completions_per_s") -> float:
    """toolbox's mean ``key`` over TRL's, across the rounds of one invocation."""
    return fmean(r[key] for r in toolbox) / fmean(r[key] for r in trl)


def run_side(spec: dict[str, Any], log_dir: str) -> dict[str, Any]:
    """Run one side in a fresh interpreter (``python -m toolbox.bench._grpo_vs_trl SPEC OUT``) and read its result."""
    return run_child("toolbox.bench._grpo_vs_trl", spec, Path(log_dir), f"{spec['model']}-{spec['side']}-{spec['round']}",
                     f"bench grpo: the {spec['side']} side ({spec['model']}, round {spec['round']})")


def run_child(module: str, spec: dict[str, Any], log_dir: Path, name: str, what: str) -> Any:
    """``python -m MODULE SPEC OUT`` in a fresh interpreter (``spec`` written to LOG_DIR/NAME.spec.json, its output
    to NAME.log), quiet about Hugging Face progress; returns what it wrote to OUT as JSON. A failure raises naming
    ``what`` with the tail of its log."""
    spec_path, out_path, log_path = (log_dir / f"{name}.{ext}" for ext in ("spec.json", "out.json", "log"))
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    with open(log_path, "w") as log:
        done = subprocess.run([sys.executable, "-m", module, str(spec_path), str(out_path)],
                              stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"{what} exited with {done.returncode}; log {log_path}:\n{tail}")
    return json.loads(out_path.read_text())


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """In the fresh process: run ``spec['side']`` and summarise it."""
    import torch

    work, warmup, steps = Workload(**spec["work"]), spec["warmup"], spec["steps"]
    per_step = work.sizes["prompts"] * work.sizes["group"]
    if spec["side"] == "trl":
        from toolbox.bench._grpo_trl import run_trl

        torch.set_num_threads(spec["trl_threads"])
        raw = run_trl(work.model_dir, spec["rows"], work.reward, work.sizes, peft_config=trl_lora(work.sizes),
                      **trl_batching(work.sizes))
        return trl_summary(raw, warmup, per_step)
    from toolbox.bench._grpo_run import run_experiment

    run = run_experiment(toolbox_overrides(work, spec["settings"]), steps, warmup)
    return {**toolbox_summary(run.history, warmup, run.rows_per_step, run.step_cpu_s), "peak_pss_mib": run.peak_pss_mib,
            "startup_s": run.startup.get("first_step_s", 0.0), "settings": run.settings,
            **{f"startup_{k}": v for k, v in run.startup.items()}}


def compare(args: Any) -> dict[str, Any]:
    """Set up each model's workload, run the sides alternately for ``args.rounds`` rounds, print and return the
    results (per model: each side's rounds, the ratios and the workload's sizes)."""
    from transformers.utils import logging as hf_logging

    from toolbox.bench._grpo_report import print_report

    hf_logging.disable_progress_bar()
    models = ["small", "medium"] if args.model == "both" else [args.model]
    settings = BEST_2CPU + list(args.overrides)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-grpo-trl-") as root:
        for model in models:
            work = workload(model, root, args.new_tokens, getattr(args, "model_path", ""), getattr(args, "lora", False))
            results[model] = compare_model(model, work, settings, args, args.logs or root)
            print_report(model, results[model], args)
    return results


def compare_model(model: str, work: Workload, settings: list[str], args: Any, logs: str) -> dict[str, Any]:
    """Both sides on ``work``, ``args.rounds`` rounds, alternating who goes first; the rounds and the ratios."""
    base = {"model": model, "work": asdict(work), "steps": args.steps, "warmup": args.warmup, "settings": settings,
            "trl_threads": args.trl_threads,
            "rows": prompt_rows(work.model_dir, work.sizes, args.steps + args.warmup, task=work.task)}
    runs: dict[str, list[dict[str, Any]]] = {"toolbox": [], "trl": []}
    for r in range(args.rounds):
        for side in (("trl", "toolbox") if r % 2 == 0 else ("toolbox", "trl")):
            runs[side].append(run_side({**base, "side": side, "round": r}, logs))
    return {**runs, "sizes": work.sizes, "ratio": ratio(runs["toolbox"], runs["trl"]),
            "ratio_tokens": ratio(runs["toolbox"], runs["trl"], "tokens_per_s"),
            "ratio_cpu": ratio(runs["toolbox"], runs["trl"], "completions_per_cpu_s")}


if __name__ == "__main__":
    spec_file, out_file = sys.argv[1:3]
    result = child(json.loads(Path(spec_file).read_text()))
    Path(out_file).write_text(json.dumps(result))
