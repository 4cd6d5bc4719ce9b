"""`Learner`: one rank of the policy learner group (model, reference, optimizer, GRPO update).

Plain torch; the `LearnerWorker` actor owns process-group setup and calls this.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from toolbox.learner.checkpoint import load_checkpoint, save_checkpoint
from toolbox.learner.config import LearnerConfig
from toolbox.learner.strategy import full_state_dict, is_distributed, wrap
from toolbox.models.loading import load_causal_lm
from toolbox.objectives.grpo import GRPOConfig, grpo_advantages, grpo_loss
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.weights import WeightBucket, pack_state_dict


def sequence_logprobs(model: nn.Module, batch: RolloutBatch, temperature: float) -> torch.Tensor:
    """``log p(response token | prefix)`` for every response position, ``[B, R]`` (0 at padding)."""
    ids = torch.cat([batch.prompt_ids_BP, batch.response_ids_BR], dim=1)
    attn = torch.cat([batch.prompt_mask_BP, batch.response_mask_BR], dim=1)
    # Left padding: positions count real tokens only, as generate() does.
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids, use_cache=False).logits
    p = batch.prompt_ids_BP.shape[1]
    logits_BRV = logits[:, p - 1 : -1].float() / temperature
    logp = torch.log_softmax(logits_BRV, dim=-1).gather(-1, batch.response_ids_BR.unsqueeze(-1)).squeeze(-1)
    return logp * batch.response_mask_BR


class Learner:
    """One learner rank. Every public method is collective: all ranks call it together."""

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: GRPOConfig, total_steps: int) -> None:
        self.cfg, self.algo = cfg, algo
        self.rank = dist.get_rank() if is_distributed() else 0
        self.world = dist.get_world_size() if is_distributed() else 1
        self.policy = wrap(load_causal_lm(model_path, dtype).train(), cfg.strategy)
        self.ref = None
        if algo.kl_coef > 0:
            self.ref = wrap(load_causal_lm(model_path, dtype).eval().requires_grad_(False), cfg.strategy)
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
        )
        from transformers import get_scheduler

        self.scheduler = get_scheduler(
            o.scheduler, self.optimizer, num_warmup_steps=o.warmup_steps,
            num_training_steps=max(1, total_steps * algo.ppo_epochs * algo.mini_batches),
        )
        self.step = 0

    # ---- the update -------------------------------------------------------------------------
    def update(self, batches: list[RolloutBatch], results: list[RewardResult]) -> dict[str, float]:
        """One GRPO step on this rank's slice of the global batch (the rollout shards, in order); returns metrics.

        Every rank reads the whole batch: group normalisation needs whole groups, and
        the batch of a step is small next to the model.
        """
        batch = RolloutBatch.concat(batches)
        rewards = RewardResult.concat(results)
        valid_B = rewards.ok_B
        adv_B = grpo_advantages(_fill_invalid(rewards, self.algo.group_size), self.algo.group_size, self.algo.advantage)
        adv_B = adv_B * valid_B
        rows = _rank_slice(len(batch), self.rank, self.world)
        mine, adv_mine = batch.select(rows), adv_B[rows]
        mine.response_mask_BR = mine.response_mask_BR * valid_B[rows].long().unsqueeze(1)
        on_policy = self.algo.ppo_epochs == 1 and self.algo.mini_batches == 1
        old_logp = None if on_policy else self._no_grad_logprobs(self.policy, mine)
        ref_logp = None if self.ref is None else self._no_grad_logprobs(self.ref, mine)
        stats: dict[str, list[float]] = defaultdict(list)
        for _ in range(self.algo.ppo_epochs):
            for mini in _chunks(len(mine), self.algo.mini_batches):
                self._optimizer_step(mine, mini, adv_mine, old_logp, ref_logp, stats)
        self.step += 1
        metrics = {k: sum(v) / len(v) for k, v in stats.items()}
        metrics.update(rewards.metrics())
        metrics["response_len"] = float(batch.response_lengths_B.float().mean())
        metrics["adv_abs"] = float(adv_B.abs().mean())
        return metrics

    def _optimizer_step(self, batch: RolloutBatch, rows: slice, adv_B: torch.Tensor, old_logp: torch.Tensor | None,
                        ref_logp: torch.Tensor | None, stats: dict[str, list[float]]) -> None:
        mask = batch.response_mask_BR[rows]
        counts = torch.tensor([float(mask.sum()), float(mask.shape[0])])
        if is_distributed():
            dist.all_reduce(counts)
        # Per-rank share of the global counts: gradients are averaged over ranks, so this makes
        # the update equal to one over the whole global mini-batch.
        tokens, seqs = float(counts[0]) / self.world, float(counts[1]) / self.world
        # Dr. GRPO's constant normaliser: the padded response width (max_new_tokens at most).
        norm_length = float(batch.response_ids_BR.shape[1])
        # Micro-batch terms are normalised by the mini-batch's counts, so they add up to its value.
        totals: dict[str, float] = defaultdict(float)
        for mb in _chunks_of(rows, self.cfg.micro_batch_size):
            part = batch.select(mb)
            logp = sequence_logprobs(self.policy, part, self.algo.temperature)
            old = logp.detach() if old_logp is None else old_logp[mb]
            ref = None if ref_logp is None else ref_logp[mb]
            terms = grpo_loss(self.algo, logp, old, ref, adv_B[mb], part.response_mask_BR, tokens, seqs, norm_length)
            terms.loss.backward()
            for k, v in (("pg_loss", terms.pg_loss), ("kl", terms.kl), ("clip_frac", terms.clip_frac),
                         ("loss", float(terms.loss.detach()))):
                totals[k] += v
        for k, v in totals.items():
            stats[k].append(v)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.optim.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        stats["grad_norm"].append(float(grad_norm))
        stats["lr"].append(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def _no_grad_logprobs(self, model: nn.Module, batch: RolloutBatch) -> torch.Tensor:
        parts = [sequence_logprobs(model, batch.select(mb), self.algo.temperature)
                 for mb in _chunks_of(slice(0, len(batch)), self.cfg.micro_batch_size)]
        width = batch.response_ids_BR.shape[1]
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])

    # ---- weights and checkpoints ------------------------------------------------------------
    def export_weights(self) -> list[WeightBucket]:
        """Full weights as buckets on rank 0; ``[]`` on other ranks."""
        state = full_state_dict(self.policy)
        return pack_state_dict(state, self.cfg.bucket_mb << 20) if self.rank == 0 else []

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return full_state_dict(self.policy)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        return save_checkpoint(path, self.policy, self.optimizer, {"step": self.step, "scheduler": self.scheduler.state_dict()})

    def load(self, path: str | Path) -> int:
        extra = load_checkpoint(Path(path), self.policy, self.optimizer)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.step = int(extra["step"])
        return self.step


def _fill_invalid(rewards: RewardResult, group_size: int) -> torch.Tensor:
    """Rewards with errored/abstained samples set to their group's mean of valid ones (so they move nothing)."""
    values = rewards.values_B.view(-1, group_size)
    ok = rewards.ok_B.view(-1, group_size).float()
    mean = (values * ok).sum(1, keepdim=True) / ok.sum(1, keepdim=True).clamp(min=1.0)
    return torch.where(ok.bool(), values, mean).reshape(-1)


def _rank_slice(n: int, rank: int, world: int) -> slice:
    if n % world:
        raise ValueError(f"a batch of {n} rows does not split evenly over {world} learner ranks")
    size = n // world
    return slice(rank * size, (rank + 1) * size)


def _chunks(n: int, parts: int) -> list[slice]:
    size = math.ceil(n / parts)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _chunks_of(rows: slice, size: int) -> list[slice]:
    start, stop = rows.start or 0, rows.stop
    return [slice(i, min(i + size, stop)) for i in range(start, stop, size)]
