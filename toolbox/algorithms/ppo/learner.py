"""`PPOLearner`: language-model PPO with a critic, on one learner rank (policy + critic, both strategy-wrapped).

`plan` (rank 0, once per step) reads the rewards and which rows were scored; `update` (every
rank, its own rows) computes old log-probs (unless one epoch of one mini-batch without a reference
makes them the training pass's own) and values, token-level GAE and runs the clipped
policy and value epochs. The critic is a second trained model of the rank with its own
optimizer and schedule, checkpointed beside the policy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from toolbox.algorithms.ppo.config import PPOConfig
from toolbox.learner.collective import global_mean, global_sum, rank, world
from toolbox.learner.config import LearnerConfig
from toolbox.learner.packed import RowForwards, balanced_shares
from toolbox.learner.policy import PolicyRank
from toolbox.learner.rows import chunks_of, mean_stats, mini_batches, no_grad_rows
from toolbox.learner.strategy import Placement, wrap
from toolbox.models.value import load_value_model
from toolbox.objectives.aggregate import aggregate
from toolbox.objectives.kl import kl_penalty
from toolbox.objectives.policy import policy_objective
from toolbox.objectives.ppo_lm import token_gae, token_rewards
from toolbox.objectives.registry import POLICY_LOSSES, VALUE_LOSSES, PolicyInputs
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.plan import StepPlan, read_step


@dataclass
class PPOPlan(StepPlan):
    """Per rank, aligned with ``rank_rows``: each row's sequence reward and whether it was scored."""

    scores: list[torch.Tensor]
    ok: list[torch.Tensor]


@dataclass
class _Rollout:
    """What one rank's epochs reuse: its rows, old log-probs and values, reference log-probs, advantages, returns."""

    batch: RolloutBatch
    old_logp: torch.Tensor | None  # None: one epoch of one mini-batch, the training pass's own log-probs
    old_values: torch.Tensor
    ref_logp: torch.Tensor | None
    adv: torch.Tensor
    ret: torch.Tensor


class PPOLearner:
    """One PPO learner rank: the policy (with an optional reference) and a critic, siblings of the GRPO learner.

    Every public method is collective: all ranks call it together (`plan`: rank 0 alone).
    """

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: PPOConfig, total_steps: int) -> None:
        self.cfg, self.algo = cfg, algo
        steps = total_steps * algo.ppo_epochs * algo.mini_batches
        self.policy = PolicyRank.pretrained(model_path, dtype, cfg, steps, frozen_reference=algo.kl_coef > 0,
                                            router_loss_coef=algo.moe_aux_loss_coef)
        self.critic = self.policy.attach("critic", wrap(load_value_model(model_path, dtype).train(), cfg.strategy,
                                                         Placement.of(cfg)),
                                         cfg.critic_optim or cfg.optim.model_copy(update={"lr": algo.critic_lr}),
                                         steps)
        self.forwards = RowForwards.of(self.policy, cfg.packing, algo.temperature, cfg.share_prompts)
        self.loss, self.value_loss = POLICY_LOSSES.build(algo.loss), VALUE_LOSSES.build(algo.value_loss)

    def plan(self, shards: list[RolloutBatch], results: list[RewardResult],
             keep_groups: list[int] | None = None) -> PPOPlan:
        """Each rank's rows and their scores; ``keep_groups`` must be ``None`` (PPO has no dynamic sampling)."""
        if keep_groups is not None:
            raise ValueError("the ppo learner trains on every sampled row; keep_groups must be None")
        step = read_step(shards, results, None)
        cuts = (balanced_shares(step.batch, world(), self.forwards.share_prompts) if self.cfg.packing
                else step.shares(world()))
        return PPOPlan(**step.plan_fields(shards, cuts), scores=[step.rewards.values_B[c] for c in cuts],
                       ok=[step.rewards.ok_B[c] for c in cuts])

    def update(self, plan: PPOPlan, shards: dict[int, RolloutBatch]) -> dict[str, float]:
        """One PPO step on this rank's rows: old log-probs/values, token GAE, clipped policy + value epochs."""
        r = rank()
        self.forwards.reset()
        rollout, kl_BT = self._rollout(plan.gather(r, shards), plan.scores[r], plan.ok[r])
        stats: dict[str, list[float]] = defaultdict(list)
        for mini in mini_batches(len(rollout.batch), self.algo.ppo_epochs, self.algo.mini_batches):
            self._ppo_step(rollout, mini, stats)
        self.policy.step += 1
        metrics = {**mean_stats(stats), **plan.metrics, **self.forwards.metrics(), **self.policy.router.metrics()}
        metrics["kl"] = 0.0 if kl_BT is None else global_mean(kl_BT, rollout.batch.loss_mask_BR)
        return metrics

    def _rollout(self, mine: RolloutBatch, scores_B: torch.Tensor,
                 ok_B: torch.Tensor) -> tuple[_Rollout, torch.Tensor | None]:
        """Old log-probs and values, the per-token KL to the reference, and (whitened) GAE of this rank's rows."""
        a, mbs, ref, fw = self.algo, self.cfg.micro_batch_size, self.policy.ref, self.forwards
        mine.response_mask_BR = mine.response_mask_BR * ok_B.long().unsqueeze(1)
        mask = mine.response_mask_BR
        # One epoch of one mini-batch with no reference: the old log-probs are the training pass's own, detached
        # (`_ppo_step`), so no separate no-grad pass. With a reference they feed the KL before the epochs start.
        on_policy = a.ppo_epochs == 1 and a.mini_batches == 1 and ref is None
        old_logp = None if on_policy else no_grad_rows(lambda part: fw.logprobs(self.policy.model, part), mine, mbs)
        old_values = no_grad_rows(lambda part: fw.values(self.critic.module, part), mine, mbs)
        ref_logp = None if ref is None else no_grad_rows(lambda part: fw.logprobs(ref, part), mine, mbs)
        # KL only where the policy acted (the loss mask); env/tool tokens are steps with no action of its own.
        kl_BT = None if ref_logp is None or old_logp is None else (
            kl_penalty(old_logp, ref_logp, a.kl_kind) * mine.loss_mask_BR)
        token_r = token_rewards(scores_B, mask, kl_BT if a.kl_in_reward else None, a.kl_coef)
        adv, ret = token_gae(token_r, old_values, mask, a.gamma, a.lam)
        if a.whiten_advantages:
            adv = _global_whiten(adv, mine.loss_mask_BR)
        return _Rollout(mine, old_logp, old_values, ref_logp, adv, ret), kl_BT

    def _ppo_step(self, ro: _Rollout, rows: slice, stats: dict[str, list[float]]) -> None:
        a, batch = self.algo, ro.batch
        # Policy terms count the model's own tokens (loss mask); the critic values every response token.
        actions, steps, seqs = global_sum([float(batch.loss_mask_BR[rows].sum()),
                                           float(batch.response_mask_BR[rows].sum()),
                                           float((batch.loss_mask_BR[rows].sum(dim=1) > 0).sum())])
        actions, steps, seqs = actions / world(), steps / world(), seqs / world()
        width = float(batch.response_mask_BR.shape[1])
        totals: dict[str, float] = defaultdict(float)
        parts = chunks_of(rows, self.cfg.micro_batch_size)
        for mb in parts:
            part = batch.select(mb)
            logp = self.forwards.logprobs(self.policy.model, part)
            old = logp.detach() if ro.old_logp is None else ro.old_logp[mb]
            x = PolicyInputs(logp, old, ro.adv[mb], part.loss_mask_BR, actions, seqs, width, part.logprobs_BR,
                             a.tis_cap or 0.0)
            # With the KL in the reward there is no KL term in the loss.
            ref = None if ro.ref_logp is None or a.kl_in_reward else ro.ref_logp[mb]
            terms = policy_objective(self.loss, x, ref, a.kl_coef, a.kl_kind)
            values = self.forwards.values(self.critic.module, part)
            vf = aggregate(self.value_loss(values, ro.old_values[mb], ro.ret[mb]), part.response_mask_BR,
                           "token-mean", token_count=steps)
            loss = self.policy.router.add(terms.loss + a.vf_coef * vf, 1.0 / len(parts))
            loss.backward()
            terms.metrics.pop("kl")  # the step's KL is measured once, over all its rows (`update`)
            for k, v in {**terms.metrics, "vf_loss": float(vf.detach()), "loss": float(loss.detach())}.items():
                totals[k] += v
        for k, v in {**totals, **self.policy.optimizer_step()}.items():
            stats[k].append(v)
        stats["critic_grad_norm"].append(self.critic.step()["grad_norm"])


def _global_whiten(x_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Zero mean, unit variance over every rank's response tokens."""
    mean = global_mean(x_BT, mask_BT)
    var = global_mean((x_BT - mean).pow(2), mask_BT)
    return (x_BT - mean) / (var**0.5 + eps) * mask_BT
