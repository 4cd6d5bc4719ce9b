"""`PPOLearner`: language-model PPO with a critic, on one learner rank (policy + critic, both FSDP2-wrapped)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

from toolbox.algorithms.grpo.learner import GRPOLearner, sequence_logprobs
from toolbox.algorithms.ppo.config import PPOConfig
from toolbox.learner.base import build_optimizer, chunks_of, no_grad_rows, rank_slice, split_into
from toolbox.learner.checkpoint import load_checkpoint, save_checkpoint
from toolbox.learner.config import LearnerConfig
from toolbox.learner.strategy import wrap
from toolbox.models.value import load_value_model, response_values
from toolbox.objectives.aggregate import aggregate
from toolbox.objectives.kl import kl_penalty
from toolbox.objectives.policy import clipped_policy_terms
from toolbox.objectives.ppo_lm import token_gae, token_rewards
from toolbox.objectives.value import clipped_value_terms
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


class PPOLearner(GRPOLearner):
    """PPO with a learned value function; reuses the GRPO learner's policy, reference and log-prob code."""

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: PPOConfig, total_steps: int) -> None:
        super().__init__(model_path, dtype, cfg, algo, total_steps)  # type: ignore[arg-type]
        self.algo: PPOConfig = algo  # type: ignore[assignment]
        self.critic = wrap(load_value_model(model_path, dtype).train(), cfg.strategy)
        steps = total_steps * algo.ppo_epochs * algo.mini_batches
        self.critic_opt, self.critic_sched = build_optimizer(self.critic, cfg.optim.model_copy(update={"lr": algo.critic_lr}), steps)

    def update(self, batches: list[RolloutBatch], results: list[RewardResult],
               keep_groups: list[int] | None = None) -> dict[str, float]:
        """One PPO step on this rank's slice: old log-probs/values, token GAE, clipped policy + value epochs."""
        batch, rewards = RolloutBatch.concat(batches), RewardResult.concat(results)
        rows = rank_slice(len(batch), self.rank, self.world)
        mine = batch.select(rows)
        mine.response_mask_BR = mine.response_mask_BR * rewards.ok_B[rows].long().unsqueeze(1)
        mask = mine.response_mask_BR
        old_logp = self._no_grad_logprobs(self.policy, mine)
        old_values = self._no_grad_values(mine)
        ref_logp = None if self.ref is None else self._no_grad_logprobs(self.ref, mine)
        kl_BT = None if ref_logp is None else kl_penalty(old_logp, ref_logp, self.algo.kl_kind) * mask
        a = self.algo
        token_r = token_rewards(rewards.values_B[rows], mask, kl_BT if a.kl_in_reward else None, a.kl_coef)
        adv, ret = token_gae(token_r, old_values, mask, a.gamma, a.lam)
        if a.whiten_advantages:
            adv = self._global_whiten(adv, mask)
        stats: dict[str, list[float]] = defaultdict(list)
        for _ in range(a.ppo_epochs):
            for mini in split_into(len(mine), a.mini_batches):
                self._ppo_step(mine, mini, old_logp, old_values, ref_logp, adv, ret, stats)
        self.step += 1
        metrics = {k: sum(v) / len(v) for k, v in stats.items()}
        metrics.update(rewards.metrics())
        metrics["response_len"] = float(batch.response_lengths_B.float().mean())
        metrics["kl"] = 0.0 if kl_BT is None else self._global_mean(kl_BT, mask)
        return metrics

    def _ppo_step(self, batch: RolloutBatch, rows: slice, old_logp: torch.Tensor, old_values: torch.Tensor,
                  ref_logp: torch.Tensor | None, adv: torch.Tensor, ret: torch.Tensor, stats: dict[str, list[float]]) -> None:
        a = self.algo
        tokens = self.global_sum([float(batch.response_mask_BR[rows].sum())])[0] / self.world
        totals: dict[str, float] = defaultdict(float)
        for mb in chunks_of(rows, self.cfg.micro_batch_size):
            part = batch.select(mb)
            m = part.response_mask_BR
            logp = sequence_logprobs(self.policy, part, a.temperature)
            pg_BT, clipped_BT = clipped_policy_terms(logp, old_logp[mb], adv[mb], a.clip_low, a.clip_high)
            pg = aggregate(pg_BT, m, "token-mean", token_count=tokens)
            values = response_values(self.critic, part)
            vf = aggregate(clipped_value_terms(values, old_values[mb], ret[mb], a.value_clip), m, "token-mean",
                           token_count=tokens)
            loss = pg + a.vf_coef * vf
            if ref_logp is not None and not a.kl_in_reward and a.kl_coef > 0:
                loss = loss + a.kl_coef * aggregate(kl_penalty(logp, ref_logp[mb], a.kl_kind), m, "token-mean",
                                                    token_count=tokens)
            loss.backward()
            totals["pg_loss"] += float(pg.detach())
            totals["vf_loss"] += float(vf.detach())
            totals["loss"] += float(loss.detach())
            totals["clip_frac"] += float(aggregate(clipped_BT, m, "token-mean", token_count=tokens))
        for k, v in totals.items():
            stats[k].append(v)
        for k, v in self.optimizer_step().items():
            stats[k].append(v)
        critic = self.optimizer_step(self.critic, self.critic_opt, self.critic_sched)
        stats["critic_grad_norm"].append(critic["grad_norm"])

    def _no_grad_values(self, batch: RolloutBatch) -> torch.Tensor:
        return no_grad_rows(lambda part: response_values(self.critic, part), batch, self.cfg.micro_batch_size)

    def _global_mean(self, x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
        total, n = self.global_sum([float((x_BT * mask_BT).sum()), float(mask_BT.sum())])
        return total / max(n, 1.0)

    def _global_whiten(self, x_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """Zero mean, unit variance over every rank's response tokens."""
        mean = self._global_mean(x_BT, mask_BT)
        var = self._global_mean((x_BT - mean).pow(2), mask_BT)
        return (x_BT - mean) / (var**0.5 + eps) * mask_BT

    def save(self, path: str | Path) -> Path:
        out = super().save(path)
        (Path(path) / "critic").mkdir(exist_ok=True)
        save_checkpoint(Path(path) / "critic", self.critic, self.critic_opt, {"scheduler": self.critic_sched.state_dict()})
        return out

    def load(self, path: str | Path) -> int:
        step = super().load(path)
        extra = load_checkpoint(Path(path) / "critic", self.critic, self.critic_opt)
        self.critic_sched.load_state_dict(extra["scheduler"])
        return step

