"""The online policy loop: rollout -> reward -> learner update -> weight sync, chained by object ref.

Shared by every algorithm that learns from its own samples (GRPO and its variants, PPO with a
critic, online DPO): they differ in their learner, not in this loop. One step submits the
whole chain and waits once; only DAPO's dynamic sampling looks at the (small) rewards of a
round before deciding whether to sample another.

Overlap (``rollout.max_staleness = k > 0``): step t also submits the first sampling round of the steps up to t + k,
before its update and weight sync. A rollout worker runs the driver's calls one at a time, in the order submitted
(a synchronous Ray actor), so those rounds sample with the weights it holds then and step t's sync lands after
them: a step's batch lags the learner by k policy versions at most. The learner trains on step t meanwhile; the
loss corrects with truncated importance sampling (``algorithm.tis_cap``) from the behaviour log-probs the engine
recorded. A checkpoint keeps the rounds sampled ahead (their batches and rewards, by value, with the policy version
that sampled them): they came from weights older than the checkpoint's, which no resumed run could sample again, so a
resumed run trains on them as the uninterrupted run does and repeats its numbers bit for bit.

Blocks (``rollout.steps_per_generation = g > 1``): steps are taken in aligned blocks ``[b*g, (b+1)*g)``, and a
block's first rounds are sampled by one engine call per worker (a decode batch g times larger: on CPU, and on a GPU
short of work, it costs far less than g calls), each step's batch still its own object. A block is submitted
whole, as soon as its last step is within ``max_staleness`` of the step running (at the latest when its first
step runs), so no batch lags more than ``max_staleness`` versions.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from toolbox.config.trainer import TrainerConfig
from toolbox.core.events import Event, EventBus
from toolbox.core.pending import Pending, wait
from toolbox.data.prompts import PromptSource, split_groups
from toolbox.engines.base import SamplingConfig
from toolbox.learner.throughput import step_rates
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.rl.roles import (
    CheckpointRole,
    Metrics,
    PolicyLearnerRole,
    RewardRole,
    RolloutRole,
    StatefulRole,
)
from toolbox.rl.sampling import DynamicRounds, GroupShape, choose_groups, informative_groups
from toolbox.tracing.entries import TraceRequest
from toolbox.trainers.base import BaseTrainer
from toolbox.trainers.healing import step_with_restarts, with_restarts
from toolbox.trainers.measures import greedy_reward, mean_over_ranks, role_shares
from toolbox.trainers.step_calls import Round, StepCalls

log = logging.getLogger(__name__)


class OnlineTrainer(BaseTrainer):
    """Samples ``algo.prompts_per_step`` groups per step, scores them, updates the learner, syncs the weights.

    ``dynamic`` (DAPO) draws more rounds of prompts until enough groups carry signal.
    """

    def __init__(self, cfg: TrainerConfig, bus: EventBus, algo: GroupShape, sampling: SamplingConfig,
                 prompts: PromptSource, rollout: RolloutRole, reward: RewardRole, learner: PolicyLearnerRole,
                 run_dir: Path, experiment: str = "", dynamic: DynamicRounds | None = None,
                 colocate: bool = False, max_staleness: int = 0, steps_per_generation: int = 1) -> None:
        """``colocate`` (``rollout.placement: colocate``): each rollout worker puts its engine to sleep once its shard
        is generated, before the learner trains on it; loading the new weights wakes it. ``max_staleness``
        (``rollout.max_staleness``): sample up to that many steps ahead while the learner trains.
        ``steps_per_generation`` (``rollout.steps_per_generation``): steps per block sampled in one call."""
        super().__init__(cfg, bus, experiment)
        if colocate and max_staleness:
            raise ValueError("colocated engines sleep while the learner trains: they cannot sample ahead")
        if steps_per_generation - 1 > max_staleness:
            raise ValueError(f"steps_per_generation={steps_per_generation} needs max_staleness >= "
                             f"{steps_per_generation - 1}, got {max_staleness}")
        self.colocate, self.max_staleness, self.steps_per_generation = colocate, max_staleness, steps_per_generation
        self.algo, self.sampling, self.prompts = algo, sampling, prompts
        self.rollout, self.reward, self.learner = rollout, reward, learner
        self.run_dir = run_dir
        self.dynamic = dynamic if dynamic is not None and dynamic.dynamic_sampling else None
        self.ahead: dict[int, Round] = {}  # first rounds of later steps, sampled while the learner trains
        self.submitted: dict[int, StepCalls] = {}  # the next step's calls, submitted before this step's wait
        self.loads: deque[Pending[float]] = deque()  # weight loads submitted and not yet waited for, oldest first
        self.version = 0  # the policy version (learner steps done) the rollout workers hold for the next sample

    def prepare(self) -> int:
        """Resume (or start), then sync the engines: calls still in flight from before are dropped, and the rounds
        the checkpoint kept come back (a restarted learner group comes back through here)."""
        self.ahead.clear()
        self.submitted.clear()
        self.loads.clear()
        start = self.resume(self.learner.load)
        wait(*self.sync_weights())
        self.version = start
        return start

    def train_step(self, step: int) -> Metrics:
        """`run_step`, where a dead learner rank restarts the learner group (``learner.max_restarts``)."""
        return step_with_restarts(self, step, self.run_step)

    def run_step(self, step: int) -> Metrics:
        """Step ``step``'s calls (submitted now, or by the step before: `_submits_next`), then the step's one wait and
        its metrics; the next step's calls go out before that wait when nothing between the two steps needs this
        step's results, so the learner finds its next update queued instead of idling while the driver reports."""
        t0 = time.perf_counter()
        calls = self.submitted.pop(step) if step in self.submitted else self._submit(step)
        if self._submits_next(step):
            self.submitted[step + 1] = self._submit(step + 1)
        wait(calls.batches, calls.rewards, calls.update, *calls.samples, *calls.weights, *calls.due)
        metrics = mean_over_ranks(calls.update.result())
        metrics["sync_s"] = max((s for load in calls.due for s in load.result()), default=0.0)
        metrics["driver_wait_s"] = time.perf_counter() - t0
        metrics.update(role_shares(metrics, step - calls.version))
        metrics.update(step_rates(metrics))
        self.bus.emit(Event.ROLLOUT_END, {"step": step + 1, "rounds": len(calls.rounds) or 1, "rows": calls.rows})
        recorded = calls.samples[0].result()[0] if calls.samples else None
        if recorded is not None:  # a learner whose plan records nothing (a plugin's) has none
            self.bus.emit(Event.SAMPLES, {"step": step + 1, "samples": recorded})
        if self.dynamic:
            metrics["sampling_rounds"] = float(len(calls.rounds))
            metrics["informative_groups"] = float(sum(ok for rd in calls.rounds for ok in rd.values()))
        return metrics

    def _submit(self, step: int) -> StepCalls:
        """Every call of step ``step``, in the order the workers must run them: its rollouts (and the rounds sampled
        ahead), its update, its weight sync when the workers sample before the next step."""
        if step not in self.ahead:
            self._first_rounds(self._block(step))
        first = self.ahead.pop(step)
        batches, rewards, rounds, rows = self._rollouts(step, first)
        self._sample_ahead(step)  # before this step's sync: they sample with the weights the workers hold now
        keep = choose_groups(rounds, self.algo.prompts_per_step) if self.dynamic else None
        trace = self.trace_request(step)
        update = self.learner.update(batches, rewards, keep, trace=trace)
        samples = [self.learner.samples()] if trace else []
        weights: list[Pending[list]] = []
        if self._samples_next(step):
            exported, loaded = self.sync_weights()
            weights.append(exported)
            self.loads.append(loaded)
            self.version = step + 1
        # Step t - k's load, queued right after this step's batch: waiting for it adds one load, nothing more.
        due = [self.loads.popleft() for _ in range(len(self.loads) - self.max_staleness)]
        return StepCalls(batches, rewards, rounds, rows, first.version, update, samples, weights, due)

    def _submits_next(self, step: int) -> bool:
        """Whether step ``step + 1``'s calls may go out before step ``step``'s wait: not when something happens
        between the two steps that must see step ``step``'s results or weights and not ``step + 1``'s (an
        evaluation, a checkpoint, the end of the run, an early stop, a profiled step), nor with DAPO's dynamic sampling (its
        rounds look at rewards first). The workers run the calls in the same order either way: the numbers do not
        change, only the driver's reporting overlaps the learner's next update."""
        nxt = step + 1
        return (self.dynamic is None and nxt < self.cfg.total_steps and nxt not in self.submitted
                and not self.evaluates_after(nxt) and not self.saves_after(nxt)
                and type(self).should_stop is BaseTrainer.should_stop and self.early_stop is None
                and nxt + 1 not in self.cfg.profile_steps)  # a profile starts before the step's update is queued

    def trace_request(self, step: int) -> TraceRequest | None:
        """At every ``trainer.log_samples_every``-th step (the first included): record ``trainer.log_samples``
        prompts' samples."""
        every = self.cfg.log_samples_every
        if not every or step % every:
            return None
        return TraceRequest(step + 1, self.cfg.log_samples, len(self.rollout))

    def _shards(self, step: int, r: int) -> list[list[PromptRequest]]:
        """Round ``r`` of step ``step``'s prompts, cut into one shard of whole groups per rollout worker."""
        a = self.algo
        return split_groups(self.prompts.step(step, a.prompts_per_step, a.group_size, round=r), len(self.rollout))

    def _round(self, step: int, r: int) -> Round:
        """Submit round ``r`` of step ``step``: its prompts generated, then scored."""
        shards = self._shards(step, r)
        # Colocated: every round sleeps (DAPO: the next round's generate wakes the engine again).
        batches = self.rollout.generate(shards, self.sampling, sleep_after=self.colocate)
        return Round(batches, self.reward.score(batches), shards, self.version)

    def _block(self, step: int) -> list[int]:
        """``step`` and the later steps of its aligned block of ``steps_per_generation`` (within the run)."""
        g = self.steps_per_generation
        return list(range(step, min((step // g + 1) * g, self.cfg.total_steps)))

    def _first_rounds(self, steps: list[int]) -> None:
        """Submit the first rounds of consecutive ``steps`` into `ahead`: one engine call per worker for them all."""
        if len(steps) == 1:
            self.ahead[steps[0]] = self._round(steps[0], 0)
            return
        shards = [self._shards(step, 0) for step in steps]
        for step, shard, batches in zip(steps, shards, self.rollout.generate_steps(shards, self.sampling)):
            self.ahead[step] = Round(batches, self.reward.score(batches), shard, self.version)

    def _sample_ahead(self, step: int) -> None:
        """Submit the first rounds of the blocks `_blocks_ahead` names."""
        for block in self._blocks_ahead(step):
            self._first_rounds(block)

    def _blocks_ahead(self, step: int) -> list[list[int]]:
        """The blocks wholly within ``step + max_staleness`` (and the run) whose first rounds are not yet in flight;
        a block reaching further waits for a later step."""
        reach = min(step + self.max_staleness, self.cfg.total_steps - 1)
        later, blocks = step + 1, []
        while later <= reach:
            block = self._block(later)
            if block[-1] > reach:
                break
            if later not in self.ahead:
                blocks.append(block)
            later = block[-1] + 1
        return blocks

    def _samples_next(self, step: int) -> bool:
        """Whether the rollout workers sample anything between step ``step``'s update and step ``step + 1``'s: only
        then do they need step ``step``'s weights now. With blocks (``steps_per_generation`` g > 1) the steps inside
        a block sample nothing, so g - 1 of every g syncs are skipped; the last step's always happens (the workers
        end with the final policy), as does one before an evaluation or a DAPO step's extra rounds."""
        nxt = step + 1
        return (self.dynamic is not None or nxt >= self.cfg.total_steps or self.evaluates_after(nxt)
                or nxt not in self.ahead or bool(self._blocks_ahead(nxt)))

    def _rollouts(self, step: int, first: Round) -> tuple[Pending[RolloutBatch], Pending[RewardResult],
                                                          list[dict[int, bool]], int]:
        """A step's rounds from its ``first``; DAPO adds rounds until enough groups inform (or none are left)."""
        a, dyn, done = self.algo, self.dynamic, [first]
        rounds: list[dict[int, bool]] = []
        while dyn is not None:
            last = done[-1]
            rounds.append(_informative(last.rewards, last.shards))  # dynamic sampling must see this round's rewards
            informing = sum(ok for rd in rounds for ok in rd.values())
            if informing >= a.prompts_per_step or len(done) == dyn.max_sampling_rounds:
                break
            done.append(self._round(step, len(done)))
        rows = sum(len(shard) for rd in done for shard in rd.shards)
        return Pending.concat([rd.batches for rd in done]), Pending.concat([rd.rewards for rd in done]), rounds, rows

    def sync_weights(self) -> tuple[Pending[list], Pending[float]]:
        """Learner rank 0 exports bucket refs; every rollout worker loads them (before its next generate)."""
        weights = self.learner.export_weights()
        return weights, self.rollout.update_weights(weights)

    def evaluate(self) -> Metrics:
        return greedy_reward(self.prompts, self.rollout, self.reward, self.sampling, self.cfg.eval_prompts)

    def save(self, step: int) -> str:
        """Step ``step``'s checkpoint; a learner rank dying while it is written restarts the group like a death in
        a step (`with_restarts`)."""
        return with_restarts(self, step, self.run_step,
                             lambda: self.save_checkpoint(self.run_dir, step, self.learner.save))

    def stateful_roles(self) -> dict[str, StatefulRole]:
        """Rollout sampling and reward RNG streams; prompts follow from (seed, step) and need no state."""
        return {"rollout": self.rollout, "reward": self.reward}

    def state_dict(self) -> dict[str, Any]:
        """The roles' states and the first rounds sampled ahead (``ahead``: batches and rewards fetched by value).
        A checkpoint is written between steps, with no next step's calls submitted (`_submits_next`), so those
        rounds are all that is in flight; the workers' RNG states, read after them, follow them."""
        ahead = {step: {"batches": rd.batches.keep(), "rewards": rd.rewards.keep(), "shards": rd.shards,
                        "version": rd.version} for step, rd in self.ahead.items()}
        return {**super().state_dict(), "ahead": ahead}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The roles' states, and the rounds sampled ahead handed back to the workers' groups for later calls; a
        round this run's plan would not train on (beyond ``trainer.total_steps``, or lagging more than
        ``rollout.max_staleness``, both changed since the checkpoint) is dropped and its step sampled anew."""
        super().load_state_dict(state)
        saved_ahead: dict[int, dict[str, Any]] = state.get("ahead", {})
        fits = {step: saved for step, saved in saved_ahead.items()
                if step < self.cfg.total_steps and step - saved["version"] <= self.max_staleness}
        if len(fits) < len(saved_ahead):
            log.warning("the checkpoint holds batches sampled ahead for steps %s; steps %s are sampled again (this "
                        "run's total_steps or max_staleness does not take them), so the resumed run is not "
                        "bit-exact", sorted(saved_ahead), sorted(set(saved_ahead) - set(fits)))
        for step, saved in fits.items():
            self.ahead[step] = Round(self.rollout.hold(saved["batches"]), self.reward.hold(saved["rewards"]),
                                     saved["shards"], saved["version"])

    def profile_target(self) -> tuple[CheckpointRole, Path]:
        return self.learner, self.run_dir

    def finish(self) -> None:
        """The weight loads still queued are waited for (a failed one fails the run); with ``trainer.export``: the
        final policy as a Hugging Face model directory, RUN_DIR/hf (`export_location`)."""
        wait(*self.loads)
        self.loads.clear()
        if self.cfg.export:
            self.learner.export_hf(self.export_location(self.run_dir))


def _informative(rewards: Pending[RewardResult], shards: list[list[PromptRequest]]) -> dict[int, bool]:
    """Per group of this round: whether its rewards differ (fetches the round's small reward results)."""
    result = RewardResult.concat(rewards.result())
    group_B = torch.tensor([req.group for shard in shards for req in shard])
    return informative_groups(result.values_B, result.ok_B, group_B)
