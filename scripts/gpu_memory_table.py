"""Print docs/gpus.md's table "What fits on 80 GB GPUs": the dry run's memory plan (`toolbox.driver.gpu_plan`) of GRPO on
Qwen2.5-0.5B / 1.5B / 7B and Llama-3.1-8B, on 1 and 8 GPUs, colocated and split, from the published architectures
(`toolbox.models.architectures`; nothing is downloaded).

Each cell takes the first layout that fits, in this order: full fine-tuning; with ``learner.offload: params`` (the
state in host memory); LoRA (r 16). Within it, the largest ``learner.micro_batch_size`` (rows of 256 prompt + 1024
response tokens) that fits. ``python scripts/gpu_memory_table.py [GPU_GIB]``.
"""

from __future__ import annotations

import sys

from toolbox.config import load_config
from toolbox.driver.gpu_plan import gpu_plan
from toolbox.driver.memory_estimate import GiB
from toolbox.driver.model_shape import model_shape

MODELS = ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
          "meta-llama/Llama-3.1-8B-Instruct")
LAYOUTS = {  # (GPUs, placement) -> learner ranks, rollout workers, GPU share each, extra settings
    (1, "colocate"): (1, 1, 0.5, ["rollout.engine.gpu_memory_utilization=0.8", "learner.offload_while_generating=true"]),
    (8, "colocate"): (8, 8, 0.5, ["rollout.engine.gpu_memory_utilization=0.8", "learner.offload_while_generating=true"]),
    (8, "split"): (4, 4, 1.0, ["rollout.engine.gpu_memory_utilization=0.9"]),
}
LEVERS = {"full": [], "offload": ["learner.offload=params", "learner.offload_while_generating=false"],
          "LoRA r16": ["learner.lora.r=16", "learner.offload_while_generating=false"]}
MICRO_BATCHES = (32, 16, 8, 4, 2, 1)


def overrides(model: str, gpus: int, placement: str) -> list[str]:
    ranks, engines, share, extra = LAYOUTS[(gpus, placement)]
    return ["experiment=grpo_tiny_fsdp2", f"model.path={model}", "model.tiny=null", "rollout.engine.name=vllm",
            f"learner.num_workers={ranks}", "learner.strategy=fsdp2", f"learner.gpus_per_worker={share}",
            "learner.mixed_precision=bf16", "learner.activation_checkpointing=true", f"rollout.num_workers={engines}",
            f"rollout.gpus_per_worker={share}", f"rollout.placement={placement}", "rollout.sampling.max_new_tokens=1024",
            "rollout.engine.enable_sleep_mode=true", *extra]


def cell(model: str, gpus: int, placement: str, gpu_gib: float) -> str:
    for lever, settings in LEVERS.items():
        for micro in MICRO_BATCHES:
            cfg = load_config([*overrides(model, gpus, placement), *settings, f"learner.micro_batch_size={micro}"])
            plan = gpu_plan(cfg, model_shape(cfg), gpu_gib)
            if plan.fits:
                return (f"{lever}, micro-batch {micro}: learner {plan.learner_peak / GiB:.0f} GiB, engine KV "
                        f"{plan.sequences:,} seqs")
    return "does not fit"


def main(gpu_gib: float = 80.0) -> None:
    print("| model | 1 GPU, colocated | 8 GPUs, colocated | 8 GPUs, split 4 + 4 |\n|---|---|---|---|")
    for model in MODELS:
        cells = [cell(model, gpus, placement, gpu_gib) for gpus, placement in LAYOUTS]
        print(f"| {model.split('/')[1]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(*(float(a) for a in sys.argv[1:]))
