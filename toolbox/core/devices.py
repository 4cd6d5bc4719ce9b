"""Which device a process computes on: the one function learners, engines and reward models share.

Kept apart from `toolbox.learner.strategy` (FSDP2, distributed checkpoints) so that a rollout or reward
worker choosing its device does not import torch.distributed's tensor and checkpoint stacks (about a
second of start-up CPU per actor; `toolbox bench startup` measures start-up).
"""

from __future__ import annotations

import torch

CPU = torch.device("cpu")


def resolve_device(choice: str, field: str = "learner.device") -> torch.device:
    """The device option ``field`` (auto|cpu|cuda) for this process: 'auto' is cuda when a GPU is visible, else cpu.

    Ray sets ``CUDA_VISIBLE_DEVICES`` of an actor to the GPU(s) it assigned (``ray.get_gpu_ids()``), so the
    rank's GPU is always ``cuda:0`` inside the actor; an actor reserved no GPU sees none and runs on cpu.
    """
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return CPU
    if choice not in ("auto", "cuda"):
        raise ValueError(f"{field}: unknown device {choice!r}; allowed: auto, cpu, cuda")
    if not torch.cuda.is_available():
        role = field.split(".")[0]
        raise RuntimeError(f"{field} is 'cuda' but this {role} worker sees no GPU: reserve one with "
                           f"{role}.gpus_per_worker (Ray then sets CUDA_VISIBLE_DEVICES) or use device: cpu")
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)
