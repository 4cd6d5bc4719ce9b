"""`LearnerWorker`: one learner rank as a Ray actor; owns ``torch.distributed`` setup."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from toolbox.actors.resolve import node_info, resolve, share
from toolbox.core.seeding import seed_everything
from toolbox.learner.config import LearnerConfig
from toolbox.learner.learner import Learner
from toolbox.objectives.grpo import GRPOConfig
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


class LearnerWorker:
    """Joins the process group, builds the `Learner`, and serves update / export / checkpoint calls."""

    def __init__(self, rank: int, world_size: int, model_path: str, dtype: str, learner: LearnerConfig,
                 algo: GRPOConfig, total_steps: int, seed: int) -> None:
        torch.set_num_threads(learner.torch_threads)
        self.rank, self.world_size = rank, world_size
        self.args = (model_path, dtype, learner, algo, total_steps)
        self.seed = seed
        self.learner: Learner | None = None

    def ready(self) -> dict[str, str]:
        return node_info()

    def rendezvous(self) -> tuple[str, int]:
        """An address and a free port on this node for rank 0 to host the process group."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return node_info()["node_ip"], port

    def setup(self, addr: str, port: int, timeout_s: float) -> None:
        cfg: LearnerConfig = self.args[2]
        if cfg.strategy != "single":
            backend = cfg.backend if cfg.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
            os.environ.setdefault("MASTER_ADDR", addr)
            dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                    world_size=self.world_size, timeout=timedelta(seconds=timeout_s))
        seed_everything(self.seed + self.rank)
        self.learner = Learner(*self.args)

    def update(self, batch_refs: list[Any], reward_refs: list[Any]) -> dict[str, float]:
        batch = RolloutBatch.concat(resolve(batch_refs), pad_id=0)
        rewards = RewardResult.concat(resolve(reward_refs))
        return self._learner.update(batch, rewards)

    def export_weights(self) -> list[Any]:
        return [share(bucket) for bucket in self._learner.export_weights()]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self._learner.full_state_dict()

    def save(self, path: str) -> str:
        return str(self._learner.save(Path(path)))

    def load(self, path: str) -> int:
        return self._learner.load(Path(path))

    @property
    def _learner(self) -> Learner:
        if self.learner is None:
            raise RuntimeError(f"learner rank {self.rank} was used before setup()")
        return self.learner
