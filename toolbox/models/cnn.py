"""`CNNEncoder`: a small convolutional encoder for image observations, shared by the policy and value heads.

The env runner keeps observations flat (``[B, H*W*C]``, as for vector observations),
so the encoder restores the image shape itself, moves channels first (gymnasium
images are ``H, W, C``) and scales pixels (``uint8`` images by 1/255). The default
layers are the Nature-DQN stack (cleanrl's Atari PPO) for 84x84 frames; tiny images
need smaller kernels and strides, which `conv_output_hw` checks before any actor starts.

Not covered: frame stacking (use gymnasium's ``FrameStackObservation`` in an env of
your own), recurrent encoders, images inside a Dict observation (Dicts are flattened).
"""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn


class CNNConfig(BaseModel):
    """Conv layers (ReLU after each) and the width of the linear layer that follows them."""

    model_config = ConfigDict(extra="forbid")
    channels: list[int] = Field(default_factory=lambda: [32, 64, 64], min_length=1,
                                description="Output channels of each conv layer.")
    kernels: list[int] = Field(default_factory=lambda: [8, 4, 3], description="Kernel size of each conv layer (one per channel entry).")
    strides: list[int] = Field(default_factory=lambda: [4, 2, 1], description="Stride of each conv layer (one per channel entry).")
    features: int = Field(512, ge=1, description="Width of the linear layer after the convs: the policy/value MLPs' input.")
    channels_first: bool = Field(False, description="Observations are (C, H, W) rather than gymnasium's usual (H, W, C).")

    @model_validator(mode="after")
    def _same_lengths(self) -> CNNConfig:
        if not len(self.channels) == len(self.kernels) == len(self.strides):
            raise ValueError(f"channels, kernels and strides need one entry per conv layer; got {len(self.channels)}, "
                             f"{len(self.kernels)} and {len(self.strides)}")
        return self


def image_layout(obs_shape: tuple[int, ...], cfg: CNNConfig) -> tuple[int, int, int]:
    """``(C, H, W)`` of an observation shape, or a `ValueError` when it is not an image."""
    if len(obs_shape) != 3:
        raise ValueError(f"the cnn encoder needs an image observation of 3 dimensions (H, W, C); got shape {obs_shape}")
    if cfg.channels_first:
        return obs_shape[0], obs_shape[1], obs_shape[2]
    return obs_shape[2], obs_shape[0], obs_shape[1]


def conv_output_hw(h: int, w: int, cfg: CNNConfig) -> tuple[int, int]:
    """Height and width after the conv stack, or a `ValueError` naming the layer the image is too small for."""
    for i, (k, s) in enumerate(zip(cfg.kernels, cfg.strides)):
        if h < k or w < k:
            raise ValueError(f"conv layer {i} (kernel {k}) does not fit its {h}x{w} input; use smaller kernels/strides "
                             f"for {cfg.kernels} / {cfg.strides}")
        h, w = (h - k) // s + 1, (w - k) // s + 1
    return h, w


class CNNEncoder(nn.Module):
    """Flat image observations ``[B, H*W*C]`` -> features ``[B, cfg.features]``."""

    def __init__(self, obs_shape: tuple[int, ...], cfg: CNNConfig, pixel_scale: float = 1.0) -> None:
        super().__init__()
        self.obs_shape, self.channels_first, self.pixel_scale = obs_shape, cfg.channels_first, pixel_scale
        c, h, w = image_layout(obs_shape, cfg)
        out_h, out_w = conv_output_hw(h, w, cfg)
        layers: list[nn.Module] = []
        for n_in, n_out, k, s in zip([c, *cfg.channels[:-1]], cfg.channels, cfg.kernels, cfg.strides):
            layers += [orthogonal(nn.Conv2d(n_in, n_out, k, s)), nn.ReLU()]
        linear = orthogonal(nn.Linear(cfg.channels[-1] * out_h * out_w, cfg.features))
        self.net = nn.Sequential(*layers, nn.Flatten(), linear, nn.ReLU())
        self.out_dim = cfg.features

    def forward(self, obs_BO: torch.Tensor) -> torch.Tensor:
        x = obs_BO.reshape(-1, *self.obs_shape)
        if not self.channels_first:
            x = x.permute(0, 3, 1, 2)
        return self.net(x * self.pixel_scale)


def orthogonal(layer: nn.Conv2d | nn.Linear) -> nn.Module:
    """Orthogonal weights with gain sqrt(2) (the ReLU gain) and zero biases, as for the MLP layers."""
    nn.init.orthogonal_(layer.weight, gain=math.sqrt(2))
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer
