"""The online policy loop: rollout -> reward -> learner update -> weight sync, all by object ref.

Shared by every algorithm that learns from its own samples (GRPO and its variants, PPO with a
critic, online DPO): they differ in their learner, not in this loop.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from toolbox.algorithms.pieces import DynamicSampling, GroupSampling
from toolbox.config.schema import TrainerConfig
from toolbox.core.events import Event, EventBus
from toolbox.data.prompts import PromptSource, split_even, split_groups
from toolbox.engines.base import SamplingConfig
from toolbox.rl.sampling import choose_groups
from toolbox.trainers.base import BaseTrainer


def mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    keys = per_rank[0].keys()
    return {k: sum(m[k] for m in per_rank) / len(per_rank) for k in keys}


class OnlineTrainer(BaseTrainer):
    """Samples ``algo.prompts_per_step`` groups per step, scores them, updates the learner, syncs the weights.

    ``dynamic`` (DAPO) draws more rounds of prompts until enough groups carry signal.
    """

    def __init__(self, cfg: TrainerConfig, bus: EventBus, algo: GroupSampling, sampling: SamplingConfig,
                 prompts: PromptSource, rollout: Any, reward: Any, learner: Any, run_dir: Path, experiment: str = "",
                 dynamic: DynamicSampling | None = None) -> None:
        super().__init__(cfg, bus, experiment)
        self.algo, self.sampling, self.prompts = algo, sampling, prompts
        self.dynamic = dynamic if dynamic is not None and dynamic.dynamic_sampling else None
        self.rollout, self.reward, self.learner = rollout, reward, learner
        self.run_dir = run_dir

    def prepare(self) -> int:
        start = 0
        if self.cfg.resume_from:
            start = self.learner.call("load", [(self.cfg.resume_from,)] * len(self.learner))[0]
        self.sync_weights()
        return start

    def train_step(self, step: int) -> dict[str, float]:
        a, dyn = self.algo, self.dynamic
        batch_refs: list[Any] = []
        reward_refs: list[Any] = []
        rounds: list[dict[int, bool]] = []
        timing = {"generate_s": 0.0, "reward_s": 0.0, "rows": 0.0}
        for r in range(dyn.max_sampling_rounds if dyn else 1):
            gen, scored = self._rollout_round(step, r, timing)
            batch_refs += [g["batch"] for g in gen]
            reward_refs += [s["result"] for s in scored]
            rounds.append({g: ok for s in scored for g, ok in s["informative"].items()})
            if sum(ok for rd in rounds for ok in rd.values()) >= a.prompts_per_step:
                break
        keep = choose_groups(rounds, a.prompts_per_step) if dyn else None
        self.bus.emit(Event.ROLLOUT_END, {"step": step + 1, "rounds": len(rounds), "rows": int(timing.pop("rows"))})
        t0 = time.perf_counter()
        metrics = mean_over_ranks(self.learner.call("update", [(batch_refs, reward_refs, keep)] * len(self.learner)))
        t1 = time.perf_counter()
        self.sync_weights()
        metrics.update(timing, train_s=t1 - t0, sync_s=time.perf_counter() - t1)
        if dyn:
            metrics["sampling_rounds"] = float(len(rounds))
            metrics["informative_groups"] = float(sum(ok for rd in rounds for ok in rd.values()))
        return metrics

    def _rollout_round(self, step: int, r: int, timing: dict[str, float]) -> tuple[list[dict], list[dict]]:
        """Generate and score one round of prompts; whole groups go to each worker."""
        requests = self.prompts.step(step, self.algo.prompts_per_step, self.algo.group_size, round=r)
        t0 = time.perf_counter()
        gen = self.rollout.call("generate", [(shard, self.sampling) for shard in split_groups(requests, len(self.rollout))])
        t1 = time.perf_counter()
        scored = self.reward.call("score", [(g["batch"],) for g in gen])
        timing["generate_s"] += t1 - t0
        timing["reward_s"] += time.perf_counter() - t1
        timing["rows"] += sum(g["rows"] for g in gen)
        return gen, scored

    def sync_weights(self) -> None:
        """Learner rank 0 exports bucket refs; every rollout worker loads them."""
        bucket_refs = self.learner.call("export_weights")[0]
        self.rollout.call("update_weights", [(bucket_refs,)] * len(self.rollout))

    def evaluate(self) -> dict[str, float]:
        greedy = self.sampling.model_copy(update={"temperature": 0.0})
        requests = self.prompts.eval_set(self.cfg.eval_prompts)
        gen = self.rollout.call("generate", [(shard, greedy) for shard in split_even(requests, len(self.rollout))])
        scored = self.reward.call("score", [(g["batch"],) for g in gen])
        n = sum(g["rows"] for g in gen)
        return {"reward": sum(s["metrics"]["reward"] * g["rows"] for s, g in zip(scored, gen)) / n}

    def save(self, step: int) -> str:
        path = self.run_dir / "checkpoints" / f"step_{step}"
        return self.learner.call("save", [(str(path),)] * len(self.learner))[0]
