"""A recipe against TRL at equal wall time: held-out pass@1 of both sides over training seconds, on one plot.

``python -m toolbox.bench recipe grpo_smollm2_arith --base-eval --vs trl [--report FILE]``

The toolbox side is the recipe run itself (`toolbox.bench.recipe`), checkpointed every ``--every`` steps. TRL's
``GRPOTrainer`` then trains the same model in a fresh process, with what the recipe fixes:

- **Prompts**: the run's own prompt sequence (`toolbox.bench._grpo_vs_trl.prompt_rows`, the recipe's task and
  seed: chat template and system prompt rendered, checked to re-tokenize to toolbox's ids), unshuffled.
- **Reward**: the recipe's reward spec, called through a TRL reward function.
- **Sampling**: ``prompts_per_step`` x ``group_size`` completions a step, the recipe's temperature, top-p and
  ``max_new_tokens``, stopping at EOS.
- **Training**: the recipe's LoRA (rank, alpha, target modules, dropout: `toolbox.learner.lora.peft_config`),
  learning rate, warm-up steps and gradient clip, fp32, KL off, one optimizer step a generation batch, the
  recipe's micro-batch (TRL accumulates its micro-batches to one step), torch threads as the recipe's learner.
- **Clock**: training seconds only: toolbox's summed ``step_time_s`` (Ray start-up, model loads, evaluation and
  checkpoints excluded), TRL's time since its first step began less the time its adapter saves took. TRL's
  budget is toolbox's whole run: it stops at the step that reaches it (or at the recipe's step count, whichever
  comes first), and the equal-time comparison is each side at the shorter side's total.
- **Scoring**: every saved point of both sides is scored by ``toolbox eval`` with the run's own config, exactly
  as the base and the recipe's exported model are (a TRL adapter is merged into the base model first).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

CURVE_DIR = "curve"  # in the recipe's run directory: the checkpoints' exports while scored, their eval outputs
TRL_DIR = "vs-trl"  # in the recipe's run directory: TRL's adapters, merged copies while scored, eval outputs


def toolbox_points(run_dir: Path, every: int) -> list[dict[str, float]]:
    """(step, training seconds) at every ``every``-th step and the last: the summed ``step_time_s`` of the run."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if r.get("event") == "step_end"]
    points, clock = [], 0.0
    for i, record in enumerate(steps, 1):
        clock += float(record["metrics"]["step_time_s"])
        if i % every == 0 or i == len(steps):
            points.append({"step": float(record["step"]), "train_s": clock})
    return points


def trl_spec(run_dir: Path, budget_s: float, every: int) -> dict[str, Any]:
    """What the TRL child needs, read from the run's own ``config.yaml`` (the recipe with its overrides)."""
    from toolbox.bench._grpo_vs_trl import prompt_rows

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    algo, rollout, learner = cfg["algorithm"], cfg["rollout"], cfg["learner"]
    sizes = {"prompts": algo["prompts_per_step"], "group": algo["group_size"],
             "new_tokens": rollout["sampling"]["max_new_tokens"], "lr": learner["optim"]["lr"],
             "micro_batch": learner["micro_batch_size"]}
    from toolbox.models.catalog import resolve_source

    model_dir = resolve_source(str(cfg["model"]["path"]), cfg["model"].get("gguf_file") or "")
    rows = prompt_rows(model_dir, sizes, cfg["trainer"]["total_steps"], task=cfg["task"], seed=cfg["trainer"]["seed"])
    return {"model_dir": model_dir, "rows": rows, "reward": cfg["reward"]["spec"], "sizes": sizes,
            "lora": learner["lora"], "warmup_steps": learner["optim"].get("warmup_steps", 0),
            "max_grad_norm": learner["optim"].get("max_grad_norm", 1.0),
            "temperature": rollout["sampling"]["temperature"], "top_p": rollout["sampling"].get("top_p", 1.0),
            "threads": learner.get("torch_threads") or 2, "budget_s": budget_s, "every": every,
            "out_dir": str(run_dir / TRL_DIR / "adapters")}


def trl_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: TRL's GRPO on the recipe's workload until ``budget_s`` training seconds; saves the
    adapter every ``every`` steps and at the stop; returns the points (step, training seconds, adapter dir)."""
    import torch
    from transformers import TrainerCallback

    from toolbox.bench._grpo_trl import run_trl
    from toolbox.bench._grpo_vs_trl import trl_batching
    from toolbox.learner.lora import LoraConfig, peft_config

    torch.set_num_threads(spec["threads"])
    out, budget, every = Path(spec["out_dir"]), spec["budget_s"], spec["every"]
    points: list[dict[str, Any]] = []

    class Race(TrainerCallback):
        """Saves the adapter at the points and stops training once the budget is spent."""

        start = 0.0
        saving = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            spent = time.perf_counter() - self.start - self.saving
            stop = spent >= budget or state.global_step >= state.max_steps
            if state.global_step % every == 0 or stop:
                began = time.perf_counter()
                target = out / f"step_{state.global_step}"
                model.save_pretrained(target)
                self.saving += time.perf_counter() - began
                points.append({"step": float(state.global_step), "train_s": spent, "adapter": str(target)})
            control.should_training_stop = stop

    lora = peft_config(LoraConfig.model_validate(spec["lora"]))
    raw = run_trl(spec["model_dir"], spec["rows"], spec["reward"], spec["sizes"], peft_config=lora,
                  callbacks=(Race(),), generation_kwargs={}, temperature=spec["temperature"], top_p=spec["top_p"],
                  lr_scheduler_type="constant_with_warmup", warmup_steps=spec["warmup_steps"],
                  max_grad_norm=spec["max_grad_norm"], **trl_batching(spec["sizes"]))
    return {"points": points, "peak_pss_mib": raw["peak_pss_mib"], "rewards": raw["rewards"]}


def merge_adapter(base_dir: str, adapter_dir: str, out: Path) -> Path:
    """TRL's saved adapter folded into the base model, as a Hugging Face directory ``toolbox eval`` loads."""
    from peft import PeftModel

    from toolbox.learner.hf_export import base_model, write_hf_dir

    merged = PeftModel.from_pretrained(base_model(base_dir), adapter_dir).merge_and_unload()
    return write_hf_dir(merged, base_dir, out)


def export_checkpoint(checkpoint: Path, out: Path) -> Path:
    """A toolbox checkpoint as a Hugging Face directory (``python -m toolbox.commands.export``; a LoRA run's is merged)."""
    subprocess.run([sys.executable, "-m", "toolbox.commands.export", str(checkpoint), str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


def checkpoint_curve(figures: dict[str, Any], every: int, evaluate: Any) -> list[dict[str, float]]:
    """Held-out pass@1 of the recipe run in ``figures`` over its training seconds: the base (when scored), every
    ``every``-th checkpoint (exported, then scored with ``evaluate(config, model_dir, out_dir)``) and the
    exported model."""
    run_dir = Path(figures["run_dir"])
    work = run_dir / CURVE_DIR
    work.mkdir(exist_ok=True)
    points = toolbox_points(run_dir, every)
    for point in points[:-1]:
        model = export_checkpoint(run_dir / "checkpoints" / f"step_{int(point['step'])}", work / "model")
        point["pass@1"] = evaluate(str(run_dir / "config.yaml"), str(model), work / f"eval-{int(point['step'])}")["pass@1"]
        shutil.rmtree(model)
    points[-1]["pass@1"] = figures["trained"]["pass@1"]
    return _from_base(figures) + points


def _from_base(figures: dict[str, Any]) -> list[dict[str, float]]:
    return [{"step": 0.0, "train_s": 0.0, "pass@1": figures["base"]["pass@1"]}] if "base" in figures else []


def race(figures: dict[str, Any], every: int, evaluate: Any, log_dir: Path | None = None) -> dict[str, Any]:
    """TRL against the recipe run in ``figures`` (its run directory, base and trained scores, and its
    `checkpoint_curve` as ``curve``); TRL's points scored with ``evaluate(config, model_dir, out_dir)`` too.
    Returns both curves and the equal-time comparison."""
    from toolbox.bench._grpo_vs_trl import run_child

    run_dir = Path(figures["run_dir"])
    work = run_dir / TRL_DIR
    work.mkdir(exist_ok=True)
    ours = figures["curve"]
    spec = trl_spec(run_dir, ours[-1]["train_s"], every)
    theirs = run_child("toolbox.bench._recipe_vs_trl", spec, log_dir or work, "trl", "bench recipe --vs trl: TRL")
    for point in theirs["points"]:
        model = merge_adapter(spec["model_dir"], point["adapter"], work / "model")
        point["pass@1"] = evaluate(str(run_dir / "config.yaml"), str(model), work / f"eval-{int(point['step'])}")["pass@1"]
        shutil.rmtree(model)
    curves = {"toolbox": ours, "trl": _from_base(figures) + theirs["points"]}
    return {"curves": curves, **equal_time(curves), "trl_peak_pss_mib": theirs["peak_pss_mib"]}


def equal_time(curves: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Each side's point at the shorter side's budget. TRL's budget is toolbox's total: where TRL stopped on it
    (its last step crossed it), the comparison is both sides' last points; where TRL ran out of steps first, its
    total is the budget, and toolbox's point is its last one within that time (none later: a point past the
    budget would favour toolbox)."""
    ours, theirs = curves["toolbox"], curves["trl"]
    budget = ours[-1]["train_s"]
    if theirs[-1]["train_s"] >= budget:
        return {"equal_s": budget, "at_equal": {"toolbox": ours[-1], "trl": theirs[-1]}}
    equal_s = theirs[-1]["train_s"]
    return {"equal_s": equal_s, "at_equal": {"toolbox": [p for p in ours if p["train_s"] <= equal_s][-1],
                                             "trl": theirs[-1]}}


if __name__ == "__main__":
    spec_file, out_file = sys.argv[1:3]
    Path(out_file).write_text(json.dumps(trl_child(json.loads(Path(spec_file).read_text()))))
