"""`PPOEnvLearner`: one rank of the classic-RL learner group (actor-critic MLP, Adam, PPO epochs).

Plain torch; the `LearnerWorker` actor owns process-group setup and builds this.
Strategies: ``single`` and ``ddp`` (an MLP this small has nothing to shard, so no
``fsdp2``). Every rank reads every runner's batch (it is small), folds the same
statistics, computes the same advantages, and trains on its own slice of the steps;
DDP averages the gradients.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from toolbox.algorithms.ppo_env.config import PPOEnvConfig
from toolbox.envs.trajectory import TrajectoryBatch
from toolbox.learner.collective import global_sum, rank, world
from toolbox.learner.config import LearnerConfig
from toolbox.learner.policy import PolicyRank
from toolbox.learner.rows import mean_stats, rank_slice
from toolbox.learner.strategy import wrap
from toolbox.models.mlp import ActorCritic, SpaceSpec
from toolbox.objectives.ppo import ppo_env_loss
from toolbox.objectives.registry import VALUE_LOSSES
from toolbox.rl.advantages import gae

Samples = dict[str, torch.Tensor]


def returns_and_advantages(batch: TrajectoryBatch, rewards_TN: torch.Tensor, gamma: float,
                           lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over a batch whose truncated steps bootstrap from ``V(final obs)`` and terminated ones do not.

    A truncated step's reward gets ``gamma * V(final obs)`` added and then counts as
    done, so GAE neither bootstraps from nor leaks across the next episode's first state.
    """
    bootstrap_TN = (batch.truncated_TN & ~batch.terminated_TN).to(rewards_TN.dtype)
    rewards_TN = rewards_TN + gamma * batch.final_values_TN * bootstrap_TN
    dones_TN = batch.terminated_TN | batch.truncated_TN
    return gae(rewards_TN, batch.values_TN, dones_TN, batch.last_value_N, gamma, lam)


class PPOEnvLearner:
    """One learner rank: the actor-critic is the rank's `PolicyRank` (AdamW, transformers schedule, the shared
    clipped optimizer step, checkpoints, export). Every public method is collective: all ranks call it together."""

    def __init__(self, spec: SpaceSpec, algo: PPOEnvConfig, cfg: LearnerConfig, total_steps: int) -> None:
        if cfg.strategy not in {"single", "ddp"}:
            raise ValueError(f"learner.strategy {cfg.strategy!r}: the ppo_env learner supports 'single' and 'ddp'")
        self.cfg, self.algo = cfg, algo
        self.model = ActorCritic(spec, algo.policy)  # unwrapped: its running statistics are read and updated here
        self.policy = PolicyRank(wrap(self.model, cfg.strategy), cfg, total_steps * algo.epochs * algo.minibatches)
        self.value_loss = VALUE_LOSSES.build(algo.value_loss)

    # ---- the update -------------------------------------------------------------------------
    def update(self, batches: list[TrajectoryBatch]) -> dict[str, float]:
        """One PPO step on the runners' batches (in runner order); returns metrics."""
        if self.algo.policy.normalize_obs:  # affects the next rollouts; these batches were normalised already
            for b in batches:
                self.model.obs_rms.update_from_moments(b.obs_mean_O, b.obs_var_O, b.obs_count)
        batch = TrajectoryBatch.concat_envs(batches)
        rewards_TN = batch.rewards_TN
        if self.algo.scale_rewards:
            self.model.ret_rms.update(batch.discounted_returns_TN.reshape(-1))
            rewards_TN = self.model.ret_rms.scale(rewards_TN, self.algo.reward_clip)
        adv_TN, ret_TN = returns_and_advantages(batch, rewards_TN, self.algo.gamma, self.algo.gae_lambda)
        samples = self._my_slice(batch, adv_TN, ret_TN)
        stats = self._epochs(samples)
        self.policy.step += 1
        metrics = mean_stats(stats)
        metrics["explained_variance"] = explained_variance(samples["values"], samples["returns"])
        metrics["updates"] = float(len(stats["loss"]))
        if self.algo.scale_rewards:
            metrics["reward_scale"] = float(self.model.ret_rms.var.sqrt())
        return metrics

    def _my_slice(self, batch: TrajectoryBatch, adv_TN: torch.Tensor, ret_TN: torch.Tensor) -> Samples:
        """Flatten ``[T, N]`` to samples and keep this rank's contiguous share."""
        n = batch.num_steps
        if n % world():
            raise ValueError(f"{n} env steps per training step do not split over {world()} learner ranks")
        rows = rank_slice(n, rank(), world())
        flat = {
            "obs": batch.obs_TNO.reshape(n, -1), "actions": batch.actions_TN.reshape(n, *batch.actions_TN.shape[2:]),
            "logp": batch.logp_TN.reshape(n), "values": batch.values_TN.reshape(n),
            "advantages": adv_TN.reshape(n), "returns": ret_TN.reshape(n),
        }
        return {k: v[rows] for k, v in flat.items()}

    def _epochs(self, data: Samples) -> dict[str, list[float]]:
        """``epochs`` shuffled passes of ``minibatches`` optimizer steps; stops early past ``target_kl``."""
        stats: dict[str, list[float]] = defaultdict(list)
        n = len(data["logp"])
        size = math.ceil(n / self.algo.minibatches)
        for _ in range(self.algo.epochs):
            perm = torch.randperm(n)
            for start in range(0, n, size):
                if not self._minibatch_step({k: v[perm[start : start + size]] for k, v in data.items()}, stats):
                    stats["kl_stopped"].append(1.0)
                    return stats
        stats["kl_stopped"].append(0.0)
        return stats

    def _minibatch_step(self, mb: Samples, stats: dict[str, list[float]]) -> bool:
        """One optimizer step; ``False`` (and no step) when the policy already moved past ``target_kl``."""
        logp, entropy, values = self.policy.model(mb["obs"], mb["actions"])
        adv = mb["advantages"]
        if self.algo.normalize_advantages and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        a = self.algo
        terms = ppo_env_loss(logp, mb["logp"], adv, entropy, values, mb["values"], mb["returns"], clip=a.clip,
                             value_fn=self.value_loss, vf_coef=a.vf_coef, ent_coef=a.ent_coef)
        if self.algo.target_kl is not None and global_sum([terms.approx_kl])[0] / world() > self.algo.target_kl:
            return False
        terms.loss.backward()
        for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac"):
            stats[key].append(getattr(terms, key))
        stats["loss"].append(float(terms.loss.detach()))
        for key, value in self.policy.optimizer_step().items():
            stats[key].append(value)
        return True


def explained_variance(pred_B: torch.Tensor, target_B: torch.Tensor) -> float:
    """``1 - Var(target - pred) / Var(target)``: 1 is a perfect critic, <= 0 no better than a constant."""
    var = float(target_B.var())
    return float("nan") if var == 0 else 1.0 - float((target_B - pred_B).var()) / var
