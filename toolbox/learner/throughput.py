"""Throughput of a training step: tokens per second per role, and the learner's model FLOPs utilisation (MFU).

MFU counts the model FLOPs of one forward and backward pass per trained token: ``6 N`` for the weights (N
parameters) plus ``12 L d T`` for attention (L layers, width d, T the step's mean sequence length), as in
PaLM's appendix B; the reference model's and old log-probs' extra forward passes and further PPO epochs are
not counted, so it is a lower bound. It is measured against a peak FLOPs figure per device: ``learner.peak_tflops``
when set, else the dense bf16 figure of a known GPU (by its name), else none (on CPU: no MFU reported).
"""

from __future__ import annotations

from typing import Any

import torch

# Dense bf16 tensor-core peaks (TFLOP/s) from the vendors' data sheets; the first name found in the device's wins.
PEAK_BF16_TFLOPS = (("H200", 989.0), ("H100", 989.0), ("H800", 989.0), ("B200", 2250.0), ("A100", 312.0),
                    ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10G", 125.0),
                    ("A10", 125.0), ("A6000", 155.0), ("V100", 125.0), ("4090", 165.0), ("3090", 71.0))


def peak_flops(device: torch.device | str, tflops: float = 0.0) -> float | None:
    """FLOP/s one device of the learner can do at best: ``tflops`` when set, else a known GPU's, else ``None``."""
    if tflops:
        return tflops * 1e12
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    return next((t * 1e12 for key, t in PEAK_BF16_TFLOPS if key in name), None)


def model_dims(model: torch.nn.Module) -> tuple[float, int, int]:
    """(parameters, layers, width) of a (possibly wrapped or sharded) causal LM; layers and width 0 where its
    config does not say (no attention term). A frozen parameter (LoRA's base weights) counts for 2/3: its backward
    computes its input's gradient but not its own, 4 of the 6 FLOPs per token."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    config: Any = getattr(getattr(model, "module", model), "config", None)  # DDP wraps the model as .module
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    width = int(getattr(config, "hidden_size", 0) or 0)
    return trained + frozen * 2 / 3, layers, width


def train_flops(dims: tuple[float, int, int], tokens: float, mean_len: float) -> float:
    """Model FLOPs of a forward and backward pass over ``tokens`` tokens of sequences ``mean_len`` long."""
    params, layers, width = dims
    return tokens * (6.0 * params + 12.0 * layers * width * mean_len)


def step_rates(metrics: dict[str, float]) -> dict[str, float]:
    """The step's tokens per second per role from its counts and phase times: ``rollout_tokens_per_s`` (sampled
    response tokens over ``generate_s``), ``learner_tokens_per_s`` (trained tokens over ``train_s``) and
    ``reward_samples_per_s``; a rate whose inputs the step lacks is left out."""
    rates = {}
    for name, count, seconds in (("rollout_tokens_per_s", "sampled_tokens", "generate_s"),
                                 ("learner_tokens_per_s", "train_tokens", "train_s"),
                                 ("reward_samples_per_s", "samples", "reward_s")):
        if metrics.get(count) and metrics.get(seconds):
            rates[name] = metrics[count] / metrics[seconds]
    return rates
