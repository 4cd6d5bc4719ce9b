"""`EnvRunnerWorker`: a Ray actor shell around an `EnvRunner` (gymnasium rollouts for classic RL)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from toolbox.rl.roles import EnvRollout

from .resolve import node_info, resolve, share

if TYPE_CHECKING:  # the runner (gymnasium, the env registry) is built in the worker: a GRPO driver imports none of it
    from toolbox.envs.env_runner import EnvRunner


class EnvRunnerWorker:
    """Steps its vector env with the current policy; the trajectory goes to the object store, the driver gets a ref."""

    def __init__(self, rank: int, build: Callable[[int], EnvRunner], torch_threads: int = 1) -> None:
        torch.set_num_threads(torch_threads)
        self.rank = rank
        self.runner = build(rank)

    def ready(self) -> dict[str, str]:
        return node_info()

    def rollout(self, num_steps: int) -> EnvRollout:
        """The trajectory by ref (the object store keeps it for the learner ranks), the episode stats by value."""
        start = time.perf_counter()
        batch, episodes = self.runner.rollout(num_steps)
        return EnvRollout(share(batch), batch.num_steps, episodes.returns, episodes.lengths, time.perf_counter() - start)

    def update_weights(self, bucket_refs: list[Any]) -> float:
        """Load the exported buckets; returns the seconds it took."""
        start = time.perf_counter()
        self.runner.load_weights(resolve(bucket_refs))
        return time.perf_counter() - start

    def evaluate(self, num_episodes: int, seed: int) -> list[float]:
        return self.runner.evaluate(num_episodes, seed)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.runner.model.state_dict().items()}

    def get_state(self) -> dict[str, Any]:
        """The runner's episodes in progress and its action-sampling generator, for a checkpoint."""
        return self.runner.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.runner.set_state(state)
