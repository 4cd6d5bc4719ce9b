"""The classic-RL driver step: env runners roll out -> learner PPO update -> weight sync, all by object ref.

Stops early once an evaluation (deterministic policy, ``algorithm.eval_episodes``
episodes on seeds never used before in the run) reaches ``algorithm.target_return``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path
from typing import Any

from toolbox.algorithms.ppo_env.config import PPOEnvConfig
from toolbox.config.trainer import TrainerConfig
from toolbox.core.events import Event, EventBus
from toolbox.core.pending import Pending, wait
from toolbox.rl.roles import CheckpointRole, EnvLearnerRole, EnvRunnerRole, StatefulRole
from toolbox.trainers.base import BaseTrainer
from toolbox.trainers.measures import mean_over_ranks

EVAL_SEED_BASE = 10**9  # evaluation seeds sit far above the training envs' (seed * 10**5 + rank * 10**3 + i)


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def split_counts(total: int, parts: int) -> list[int]:
    """``total`` items over ``parts`` workers as evenly as possible, the first ones taking the remainder."""
    return [total // parts + (i < total % parts) for i in range(parts)]


class PPOEnvTrainer(BaseTrainer):
    """PPO on gymnasium envs with env-runner actors and a learner group."""

    def __init__(self, cfg: TrainerConfig, bus: EventBus, algo: PPOEnvConfig, runners: EnvRunnerRole, learner: EnvLearnerRole,
                 run_dir: Path, steps_per_step: int, experiment: str = "") -> None:
        super().__init__(cfg, bus, experiment)
        self.algo, self.runners, self.learner, self.run_dir = algo, runners, learner, run_dir
        self.steps_per_step = steps_per_step
        self.returns: deque[float] = deque(maxlen=algo.return_window)
        self.lengths: deque[int] = deque(maxlen=algo.return_window)
        self.env_steps = 0
        self.evals = 0
        self.last_eval: float | None = None

    def prepare(self) -> int:
        start = self.resume(self.learner.load)
        wait(*self.sync_weights())
        return start

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        rollouts = self.runners.rollout(self.algo.steps_per_env).result()  # episode stats; batches stay in the store
        t1 = time.perf_counter()
        steps = sum(r.steps for r in rollouts)
        self.env_steps += steps
        finished = [x for r in rollouts for x in r.returns]
        self.returns.extend(finished)
        self.lengths.extend(x for r in rollouts for x in r.lengths)
        self.bus.emit(Event.ROLLOUT_END, {"step": step + 1, "rows": steps})
        update = self.learner.update(rollouts)
        wait(update)
        metrics = mean_over_ranks(update.result())
        t2 = time.perf_counter()
        wait(*self.sync_weights())
        t3 = time.perf_counter()
        metrics.update(env_steps=self.env_steps, episode_return=_mean(self.returns),
                       episode_len=_mean(self.lengths), episodes=float(len(finished)),
                       env_steps_per_s=steps / (t3 - t0), rollout_s=t1 - t0, train_s=t2 - t1, sync_s=t3 - t2)
        return metrics

    def sync_weights(self) -> tuple[Pending[list], Pending[float]]:
        """Learner rank 0 exports bucket refs; every env runner loads them."""
        weights = self.learner.export_weights()
        return weights, self.runners.update_weights(weights)

    def evaluate(self) -> dict[str, float]:
        """The deterministic policy on ``eval_episodes`` fresh seeds, split over the runners."""
        counts = split_counts(self.algo.eval_episodes, len(self.runners))
        base = EVAL_SEED_BASE + self.cfg.seed * 10**6 + self.evals * self.algo.eval_episodes
        seeds = [base + sum(counts[:i]) for i in range(len(counts))]
        returns = [x for part in self.runners.evaluate(counts, seeds) for x in part]
        self.evals += 1
        self.last_eval = _mean(returns)
        return {"eval_return": self.last_eval, "eval_return_min": min(returns), "eval_episodes": float(len(returns)),
                "env_steps": float(self.env_steps)}

    def profile_target(self) -> tuple[CheckpointRole, Path]:
        return self.learner, self.run_dir

    def should_stop(self) -> bool:
        target = self.algo.target_return
        if target is None:
            return False
        if self.algo.target_metric == "episode_return":  # a full window, as RLlib's smoothed mean
            return len(self.returns) == self.returns.maxlen and _mean(self.returns) >= target
        return self.last_eval is not None and self.last_eval >= target

    def summarize(self, wall_s: float) -> dict[str, Any]:
        summary = super().summarize(wall_s)
        summary.update(env_steps=self.env_steps, episode_return=_mean(self.returns),
                       eval_return=self.last_eval if self.last_eval is not None else math.nan,
                       target_return=self.algo.target_return, reached_target=self.should_stop(),
                       env_steps_per_s=round(self.env_steps / max(wall_s, 1e-9), 1))
        return summary

    def save(self, step: int) -> str:
        return self.save_checkpoint(self.run_dir, step, self.learner.save)

    def stateful_roles(self) -> dict[str, StatefulRole]:
        """The env runners: episodes in progress and action-sampling RNGs."""
        return {"env": self.runners}

    def state_dict(self) -> dict[str, Any]:
        """The runners' state, and the driver's episode window and counters. (The running obs/reward
        normalisation statistics are model buffers: the learner's part of the checkpoint holds them.)"""
        return {**super().state_dict(), "returns": list(self.returns), "lengths": list(self.lengths),
                "env_steps": self.env_steps, "evals": self.evals, "last_eval": self.last_eval}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.returns.extend(state["returns"])
        self.lengths.extend(state["lengths"])
        self.env_steps, self.evals, self.last_eval = state["env_steps"], state["evals"], state["last_eval"]
