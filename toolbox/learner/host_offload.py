"""A colocated learner's state out of the GPU while the engine on the same GPU generates
(``learner.offload_while_generating``).

`HostOffload.offload` moves every trained module's parameters and gradients (``module.to("cpu")``) and its
optimizer's state tensors to host memory, then returns the freed blocks to the CUDA driver so the engine's wake can
take them; `HostOffload.reload` moves exactly what was moved back to where it was. Only tensors on a CUDA device
move: a rank on the CPU, and a module FSDP2 already keeps in host memory (``learner.offload``, the reference model of
an fsdp2 rank on cuda), stay where they are, and the calls only change the phase (`on_device`).

Why ``module.to()``: FSDP2's ``FSDPModule._apply`` reshards first and re-registers each sharded parameter after the
move (``FSDPParam.reset_sharded_param``), and ``nn.Module._apply`` swaps a DTensor parameter's contents in place
(``torch.utils.swap_tensors`` for wrapper subclasses), so the optimizer's references to its parameters stay valid.
torch 2.13 has no FSDP2 helper for a temporary offload (``CPUOffloadPolicy`` is permanent and slows every step).
DDP is refused by the config: its reducer keeps gradient buckets on the device it was built on.

The worker calls `reload` before anything that touches the model (update, export, checkpoints) and `offload` after
each weight export (`toolbox.actors.learner.LearnerWorker`), so the learner's state is on the host from the export
until the next update: while the engines wake, load the weights and generate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)


class HostOffload:
    """Moves ``modules`` (with their optimizers, where they have one) between their CUDA device and host memory."""

    def __init__(self, modules: Sequence[tuple[nn.Module, torch.optim.Optimizer | None]]) -> None:
        self.modules = list(modules)
        self.on_device = True
        self._homes: list[torch.device | None] = []  # per module: the CUDA device it left, None if it stayed
        self._state: list[tuple[dict[str, Any], str, torch.device]] = []  # optimizer state entries moved

    @classmethod
    def of(cls, learner: Any) -> HostOffload:
        """For a learner with a `toolbox.learner.policy.PolicyRank` (``learner.policy``): the policy and every
        companion (a critic) with their optimizers, and the frozen reference."""
        policy = learner.policy
        trained = [policy.trained, *policy.companions.values()]
        modules: list[tuple[nn.Module, torch.optim.Optimizer | None]] = [(t.module, t.optimizer) for t in trained]
        if isinstance(policy.ref, nn.Module):
            modules.append((policy.ref, None))
        return cls(modules)

    def offload(self) -> None:
        """Everything on a CUDA device to host memory (a no-op when already offloaded)."""
        if not self.on_device:
            return
        self.on_device = False
        self._homes = [_cuda_home(module) for module, _ in self.modules]
        self._state = []
        moved = 0
        for (module, optimizer), home in zip(self.modules, self._homes):
            if home is not None:
                moved += _nbytes(module)
                module.to("cpu")
            for state in (optimizer.state.values() if optimizer is not None else ()):
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                        self._state.append((state, key, value.device))
                        moved += value.numel() * value.element_size()
                        state[key] = value.to("cpu")
        if moved:
            torch.cuda.empty_cache()  # hand the blocks back, so the colocated engine can take them
            log.debug("learner offloaded %.1f MB to host memory", moved / 2**20)

    def reload(self) -> None:
        """What `offload` moved, back where it was (a no-op when on the device)."""
        if self.on_device:
            return
        for (module, _), home in zip(self.modules, self._homes):
            if home is not None:
                module.to(home)
        for state, key, device in self._state:
            state[key] = state[key].to(device)
        self._homes, self._state = [], []
        self.on_device = True


def _cuda_home(module: nn.Module) -> torch.device | None:
    """The CUDA device ``module``'s parameters live on, or None (on the CPU, or offloaded by FSDP2 for good).

    Parameters only: a module FSDP2 offloads keeps its buffers (rotary frequencies) on the GPU, and moving it back
    "home" would copy the whole offloaded reference through the GPU every step."""
    devices = {t.device for t in module.parameters()}
    cuda = [d for d in devices if d.type == "cuda"]
    if len(cuda) > 1:
        raise RuntimeError(f"learner.offload_while_generating: a module spans several GPUs {sorted(map(str, cuda))}; "
                           f"each learner rank holds its model on one")
    return cuda[0] if cuda else None


def _nbytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])
