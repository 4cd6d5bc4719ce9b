"""The online policy loop: rollout -> reward -> learner update -> weight sync, chained by object ref.

Shared by every algorithm that learns from its own samples (GRPO and its variants, PPO with a
critic, online DPO): they differ in their learner, not in this loop. One step submits the
whole chain and waits once; only DAPO's dynamic sampling looks at the (small) rewards of a
round before deciding whether to sample another.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from toolbox.algorithms.pieces import DynamicSampling, GroupSampling
from toolbox.config.schema import TrainerConfig
from toolbox.core.events import Event, EventBus
from toolbox.core.pending import Pending, wait
from toolbox.data.prompts import PromptSource, split_even, split_groups
from toolbox.engines.base import SamplingConfig
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.rl.sampling import choose_groups, informative_groups
from toolbox.tracing.entries import TraceRequest
from toolbox.trainers.base import BaseTrainer
from toolbox.trainers.healing import step_with_restarts
from toolbox.trainers.roles import Metrics, PolicyLearnerRole, RewardRole, RolloutRole, StatefulRole


def mean_over_ranks(per_rank: list[Metrics]) -> Metrics:
    keys = per_rank[0].keys()
    return {k: sum(m[k] for m in per_rank) / len(per_rank) for k in keys}


class OnlineTrainer(BaseTrainer):
    """Samples ``algo.prompts_per_step`` groups per step, scores them, updates the learner, syncs the weights.

    ``dynamic`` (DAPO) draws more rounds of prompts until enough groups carry signal.
    """

    def __init__(self, cfg: TrainerConfig, bus: EventBus, algo: GroupSampling, sampling: SamplingConfig,
                 prompts: PromptSource, rollout: RolloutRole, reward: RewardRole, learner: PolicyLearnerRole,
                 run_dir: Path, experiment: str = "", dynamic: DynamicSampling | None = None,
                 colocate: bool = False) -> None:
        """``colocate`` (``rollout.placement: colocate``): each rollout worker puts its engine to sleep once its shard
        is generated, before the learner trains on it; loading the new weights wakes it."""
        super().__init__(cfg, bus, experiment)
        self.colocate = colocate
        self.algo, self.sampling, self.prompts = algo, sampling, prompts
        self.rollout, self.reward, self.learner = rollout, reward, learner
        self.run_dir = run_dir
        self.dynamic = dynamic if dynamic is not None and dynamic.dynamic_sampling else None

    def prepare(self) -> int:
        start = self.resume(self.learner.load)
        wait(*self.sync_weights())
        return start

    def train_step(self, step: int) -> Metrics:
        """`run_step`, where a dead learner rank restarts the learner group (``learner.max_restarts``)."""
        return step_with_restarts(self, step, self.run_step)

    def run_step(self, step: int) -> Metrics:
        t0 = time.perf_counter()
        batches, rewards, rounds, rows = self._rollouts(step)
        keep = choose_groups(rounds, self.algo.prompts_per_step) if self.dynamic else None
        trace = self.trace_request(step)
        update = self.learner.update(batches, rewards, keep, trace=trace)
        samples = [self.learner.samples()] if trace else []
        sync = self.sync_weights()
        wait(batches, rewards, update, *samples, *sync)  # the step's one wait
        metrics = mean_over_ranks(update.result())
        metrics["sync_s"] = max(sync[1].result(), default=0.0)
        metrics["driver_wait_s"] = time.perf_counter() - t0
        self.bus.emit(Event.ROLLOUT_END, {"step": step + 1, "rounds": len(rounds) or 1, "rows": rows})
        recorded = samples[0].result()[0] if samples else None
        if recorded is not None:  # a learner whose plan records nothing (a plugin's) has none
            self.bus.emit(Event.SAMPLES, {"step": step + 1, "samples": recorded})
        if self.dynamic:
            metrics["sampling_rounds"] = float(len(rounds))
            metrics["informative_groups"] = float(sum(ok for rd in rounds for ok in rd.values()))
        return metrics

    def trace_request(self, step: int) -> TraceRequest | None:
        """At every ``trainer.log_samples_every``-th step (the first included): record ``trainer.log_samples``
        prompts' samples."""
        every = self.cfg.log_samples_every
        if not every or step % every:
            return None
        return TraceRequest(step + 1, self.cfg.log_samples, len(self.rollout))

    def _rollouts(self, step: int) -> tuple[Pending[RolloutBatch], Pending[RewardResult], list[dict[int, bool]], int]:
        """Generate and score a step's prompts (whole groups per shard); DAPO adds rounds until enough groups inform."""
        a, dyn = self.algo, self.dynamic
        batches: list[Pending[RolloutBatch]] = []
        rewards: list[Pending[RewardResult]] = []
        rounds: list[dict[int, bool]] = []
        rows = 0
        for r in range(dyn.max_sampling_rounds if dyn else 1):
            shards = split_groups(self.prompts.step(step, a.prompts_per_step, a.group_size, round=r), len(self.rollout))
            if self.colocate:  # every round sleeps (DAPO: the next round's generate wakes the engine again)
                batches.append(self.rollout.generate(shards, self.sampling, sleep_after=True))
            else:
                batches.append(self.rollout.generate(shards, self.sampling))
            rewards.append(self.reward.score(batches[-1]))
            rows += sum(len(s) for s in shards)
            if dyn is None:
                break
            rounds.append(_informative(rewards[-1], shards))  # dynamic sampling must see this round's rewards
            if sum(ok for rd in rounds for ok in rd.values()) >= a.prompts_per_step:
                break
        return Pending.concat(batches), Pending.concat(rewards), rounds, rows

    def sync_weights(self) -> tuple[Pending[list], Pending[float]]:
        """Learner rank 0 exports bucket refs; every rollout worker loads them (before its next generate)."""
        weights = self.learner.export_weights()
        return weights, self.rollout.update_weights(weights)

    def evaluate(self) -> Metrics:
        return greedy_reward(self.prompts, self.rollout, self.reward, self.sampling, self.cfg.eval_prompts)

    def save(self, step: int) -> str:
        return self.save_checkpoint(self.run_dir, step, self.learner.save)

    def stateful_roles(self) -> dict[str, StatefulRole]:
        """Rollout sampling and reward RNG streams; prompts follow from (seed, step) and need no state."""
        return {"rollout": self.rollout, "reward": self.reward}

    def finish(self) -> None:
        """With ``trainer.export``: the final policy as a Hugging Face model directory, RUN_DIR/hf."""
        if self.cfg.export:
            self.learner.export_hf(str(self.run_dir / "hf"))


def greedy_reward(prompts: PromptSource, rollout: RolloutRole, reward: RewardRole, sampling: SamplingConfig,
                  num_prompts: int) -> Metrics:
    """Mean reward of greedy completions of ``num_prompts`` held-out prompts (the loops' evaluation)."""
    greedy = sampling.model_copy(update={"temperature": 0.0})
    requests = prompts.eval_set(num_prompts)
    scored = reward.score(rollout.generate(split_even(requests, len(rollout)), greedy))
    return {"reward": RewardResult.concat(scored.result()).metrics()["reward"]}


def _informative(rewards: Pending[RewardResult], shards: list[list[PromptRequest]]) -> dict[int, bool]:
    """Per group of this round: whether its rewards differ (fetches the round's small reward results)."""
    result = RewardResult.concat(rewards.result())
    group_B = torch.tensor([req.group for shard in shards for req in shard])
    return informative_groups(result.values_B, result.ok_B, group_B)
