"""`RaftTrainer`: RAFT's driver loop over the typed role groups, waiting once per step.

One step chains four calls without waiting in between: generate (one shard of whole
groups per rollout worker) -> score (each shard as soon as it is generated) -> update
(rank 0 plans, every rank trains on its rows) -> export and load weights. The driver
then waits once and sees only the metric dicts. The role groups are typed by the
Protocols of `toolbox.rl.roles`, so a test can hand the loop in-process fakes.
"""

from __future__ import annotations

from pathlib import Path

from toolbox.config.trainer import TrainerConfig
from toolbox.core.events import EventBus
from toolbox.core.pending import wait
from toolbox.data.prompts import PromptSource, split_groups
from toolbox.engines.base import SamplingConfig
from toolbox.rl.roles import Metrics, PolicyLearnerRole, RewardRole, RolloutRole, StatefulRole
from toolbox.trainers.base import BaseTrainer
from toolbox.trainers.measures import greedy_reward, mean_over_ranks

from toolbox_raft.config import RaftConfig


class RaftTrainer(BaseTrainer):
    """Samples ``group_size`` completions for each of ``prompts_per_step`` prompts, fine-tunes on the best."""

    def __init__(self, cfg: TrainerConfig, bus: EventBus, algo: RaftConfig, sampling: SamplingConfig,
                 prompts: PromptSource, rollout: RolloutRole, reward: RewardRole, learner: PolicyLearnerRole,
                 run_dir: Path, experiment: str = "") -> None:
        super().__init__(cfg, bus, experiment)
        self.algo, self.sampling, self.prompts = algo, sampling, prompts
        self.rollout, self.reward, self.learner = rollout, reward, learner
        self.run_dir = run_dir

    def prepare(self) -> int:
        """Resume if asked, and give the rollout workers the learner's weights before the first step."""
        start = self.resume(self.learner.load)  # the learner group, then the driver's state (state_dict)
        weights = self.learner.export_weights()
        wait(weights, self.rollout.update_weights(weights))
        return start

    def train_step(self, step: int) -> Metrics:
        a = self.algo
        requests = self.prompts.step(step, a.prompts_per_step, a.group_size)
        batches = self.rollout.generate(split_groups(requests, len(self.rollout)), self.sampling)
        rewards = self.reward.score(batches)
        update = self.learner.update(batches, rewards)
        weights = self.learner.export_weights()
        loaded = self.rollout.update_weights(weights)  # each worker loads before its next generate
        wait(batches, rewards, update, weights, loaded)  # the step's one wait, in pipeline order
        return mean_over_ranks(update.result())

    def evaluate(self) -> Metrics:
        """Mean reward of greedy completions of the task's held-out prompts (the shared evaluation)."""
        return greedy_reward(self.prompts, self.rollout, self.reward, self.sampling, self.cfg.eval_prompts)

    def save(self, step: int) -> str:
        """Atomic: staged, marked COMPLETE and renamed to step_N once the learner group and the driver wrote it."""
        return self.save_checkpoint(self.run_dir, step, self.learner.save)

    def stateful_roles(self) -> dict[str, StatefulRole]:
        """Workers whose RNG streams checkpoints keep, so a resumed run samples as an uninterrupted one."""
        return {"rollout": self.rollout, "reward": self.reward}
