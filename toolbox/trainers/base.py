"""`BaseTrainer`: the fixed skeleton every algorithm's driver loop runs (Template Method).

``fit()`` = prepare -> for each step: train_step, maybe_evaluate, maybe_save (until should_stop) -> finish.
Subclasses write ``train_step`` (and optionally ``evaluate``/``save``/``prepare``).
The loop never prints or writes files itself: it emits events, and callbacks do.

Checkpoints (`save_checkpoint` / `resume`) are atomic and complete: the learner's shards, the
driver's own state (`state_dict`: role RNG states, running episode statistics, ...) and the plan
(``total_steps``) are staged, then marked complete and renamed (`toolbox.trainers.checkpoints`).
"""

from __future__ import annotations

import io
import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from toolbox.config.trainer import TrainerConfig
from toolbox.core.events import Event, EventBus
from toolbox.core.retry import take_retries
from toolbox.core.storage import begin_checkpoint, commit_checkpoint, read_file, write_file
from toolbox.rl.roles import CheckpointRole, StatefulRole
from toolbox.trainers import checkpoints
from toolbox.trainers.watch import MetricWatch, keep_best

log = logging.getLogger(__name__)
TRAINER_STATE = "trainer_state.pt"  # the driver's part of a checkpoint
# Step metrics the summary averages (as mean_NAME): the throughput, and where a step's time went.
THROUGHPUT = ("rollout_tokens_per_s", "learner_tokens_per_s", "mfu", "generate_s", "reward_s", "train_s", "sync_s",
              "rollout_idle", "learner_idle")


class BaseTrainer(ABC):
    """Drives one experiment. Holds worker groups and small metric dicts, never bulk tensors."""

    def __init__(self, cfg: TrainerConfig, bus: EventBus, experiment: str = "") -> None:
        self.cfg, self.bus, self.experiment = cfg, bus, experiment
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.last_checkpoint = ""
        self.latest_eval: tuple[int, dict[str, float]] | None = None  # (step, metrics) of the latest evaluation
        self.early_stop = MetricWatch(cfg.early_stop, "trainer.early_stop") if cfg.early_stop else None
        self.best = MetricWatch(cfg.keep_best, "trainer.keep_best") if cfg.keep_best else None
        self.best_saved: float | None = None  # the watched value at the current best checkpoint
        take_retries()  # this process's retries before this run are not its own (toolbox.core.retry)
        self.retries = 0.0  # retried calls of every role so far

    # ---- the skeleton -------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        start = time.perf_counter()
        self.step = start_step = self.prepare()
        self.bus.emit(Event.FIT_START, {"start_step": self.step, "total_steps": self.cfg.total_steps})
        while self.step < self.cfg.total_steps:
            self.bus.emit(Event.STEP_END, {"step": self.step + 1, "metrics": self._timed_step()})
            self._observe("", self.history[-1])
            self.maybe_evaluate()
            stop = self.should_stop() or self._patience_spent()
            self.maybe_save(final=stop)
            if stop:
                break
        if self.cfg.final_eval and self.step > start_step and (self.latest_eval is None or self.latest_eval[0] != self.step):
            self.maybe_evaluate(final=True)
        summary = self.summarize(time.perf_counter() - start)
        self.finish()
        self.bus.emit(Event.FIT_END, {"step": self.step, "summary": summary})
        return summary

    def _timed_step(self) -> dict[str, float]:
        """``train_step``, timed (and profiled when ``trainer.profile_steps`` names it); advances ``step``."""
        target = self.profile_target() if self.step + 1 in self.cfg.profile_steps else None
        if target is not None:
            target[0].profile(str(target[1] / "profile" / f"step_{self.step + 1}"))
        t0 = time.perf_counter()
        metrics = self.train_step(self.step)
        self.step += 1
        metrics["step_time_s"] = time.perf_counter() - t0
        # the step's retried calls: the workers' (carried by their batches and scores) and this process's own
        retries = metrics.pop("retries", 0.0) + take_retries()
        if retries:
            metrics["retries"] = retries
            self.retries += retries
        if target is not None:
            log.info("profile of step %d: %s", self.step, ", ".join(target[0].profile(None)))
        self.history.append(metrics)
        return metrics

    def maybe_evaluate(self, final: bool = False) -> None:
        """Evaluate when ``trainer.eval_every`` says, or ``final``: the end-of-run evaluation, whose event is left
        out for an algorithm without an evaluation (no metrics)."""
        if not (final or self.evaluates_after(self.step)):
            return
        metrics = self.evaluate()
        if final and not metrics:
            return
        self.latest_eval = (self.step, metrics)
        self.bus.emit(Event.EVAL_END, {"step": self.step, "metrics": metrics, **({"final": True} if final else {})})
        self._observe("eval", metrics)

    def maybe_save(self, final: bool = False) -> None:
        if final or self.saves_after(self.step):
            best = self._becomes_best()  # decided first, so the checkpoint's state knows it is the best
            self.last_checkpoint = self.save(self.step)
            self.bus.emit(Event.CHECKPOINT_SAVED, {"step": self.step, "path": self.last_checkpoint})
            if self.best is not None and best is not None:
                path = keep_best(self.last_checkpoint, self.step, self.best.cfg.metric, best, self.cfg.storage_retry)
                log.info("best checkpoint so far (%s = %.4g): %s", self.best.cfg.metric, best, path)

    def _observe(self, source: str, metrics: dict[str, float]) -> None:
        for watch in (self.early_stop, self.best):
            if watch is not None:
                watch.observe(source, metrics)

    def _patience_spent(self) -> bool:
        watch, cfg = self.early_stop, self.cfg.early_stop
        if watch is None or cfg is None or watch.since_best < cfg.patience:
            return False
        log.info("early stop at step %d: %s has not improved on %.4g for %d observations", self.step,
                 watch.cfg.metric, watch.best, watch.since_best)
        return True

    def _becomes_best(self) -> float | None:
        """The watched value when the checkpoint about to be saved is the best so far (noted as such), else None."""
        watch = self.best
        if watch is None or watch.latest is None or not watch.better(watch.latest, self.best_saved):
            return None
        self.best_saved = watch.latest
        return watch.latest

    def evaluates_after(self, done: int) -> bool:
        """Whether the loop evaluates once ``done`` steps are done (every ``trainer.eval_every``, and at the end)."""
        every = self.cfg.eval_every
        return bool(every) and (done % every == 0 or done == self.cfg.total_steps)

    def saves_after(self, done: int) -> bool:
        """Whether the loop checkpoints once ``done`` steps are done (every ``trainer.save_every``, and at the end)."""
        every = self.cfg.save_every
        return done == self.cfg.total_steps or bool(every and done % every == 0)

    def summarize(self, wall_s: float) -> dict[str, Any]:
        """Reward over the first and last 10% of this run's steps, and wall time."""
        rewards = [m["reward"] for m in self.history if "reward" in m]
        k = max(1, len(rewards) // 10)
        summary: dict[str, Any] = {"experiment": self.experiment, "steps": self.step}
        if rewards:
            summary["reward_first_10pct"] = sum(rewards[:k]) / k
            summary["reward_last_10pct"] = sum(rewards[-k:]) / k
        steady = self.history[1:] or self.history  # the first step pays for warm-up (compilation, caches)
        for key in THROUGHPUT:
            values = [m[key] for m in steady if key in m]
            if values:
                summary[f"mean_{key}"] = sum(values) / len(values)
        if self.latest_eval is not None:  # the latest evaluation (the final one, with trainer.final_eval)
            summary["eval_step"] = self.latest_eval[0]
            summary.update({f"eval/{k}": v for k, v in self.latest_eval[1].items()})
        self.retries += take_retries()  # the last step's checkpoint publish, after its metrics were reported
        if self.retries:
            summary["retries"] = self.retries
        summary["train_wall_time_s"] = round(wall_s, 1)
        summary["last_checkpoint"] = self.last_checkpoint
        return summary

    # ---- what algorithms provide --------------------------------------------------------------
    def prepare(self) -> int:
        """Start-up work (initial weight sync, resume); returns the step to start from."""
        return 0

    @abstractmethod
    def train_step(self, step: int) -> dict[str, float]:
        """One step of the algorithm; returns its metrics."""

    def evaluate(self) -> dict[str, float]:
        return {}

    def should_stop(self) -> bool:
        """Checked after each step's evaluation: ``True`` ends the run early (with a final checkpoint)."""
        return False

    @abstractmethod
    def save(self, step: int) -> str:
        """Checkpoint; returns where it went."""

    def finish(self) -> None:
        return None

    def profile_target(self) -> tuple[CheckpointRole, Path] | None:
        """The learner group whose ranks ``trainer.profile_steps`` records, and the run directory its traces go
        to; ``None``: this trainer has none to profile."""
        return None

    def stateful_roles(self) -> dict[str, StatefulRole]:
        """The worker groups whose state (RNG streams, episodes in progress) a checkpoint keeps; none by default."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs beyond the learner: each stateful role's worker states, and the watched metrics
        (early stopping's patience so far, the value of the best checkpoint) (extend it with the driver's own
        running statistics); picklable."""
        watches = {"early_stop": self.early_stop and self.early_stop.state(), "keep_best": self.best and
                   self.best.state(), "best_saved": self.best_saved}
        return {"roles": {name: role.states() for name, role in self.stateful_roles().items()}, "watches": watches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (called by `resume` after the learner is loaded)."""
        watches = state.get("watches", {})
        for watch, name in ((self.early_stop, "early_stop"), (self.best, "keep_best")):
            if watch is not None and watches.get(name):
                watch.load(watches[name])
        if self.best is not None and (watches.get("keep_best") or {}).get("metric") == self.best.cfg.metric:
            self.best_saved = watches["best_saved"]  # a resumed run's best checkpoint is replaced only by a better one
        saved = state.get("roles", {})
        for name, role in self.stateful_roles().items():
            if name in saved:
                role.load_states(saved[name])
            else:
                log.warning("the checkpoint holds no state of the %s workers: they start fresh streams", name)

    # ---- atomic, complete checkpoints ---------------------------------------------------------
    def save_checkpoint(self, run_dir: Path, step: int, save_learner: Callable[[str], str]) -> str:
        """Step ``step``'s checkpoint in ``checkpoints/step_N`` of the run (on a remote run_root: on the store, the
        ranks writing straight to it), marked complete once the learner group (every rank: ``save_learner``
        returns when all have) and the driver have written their parts, older ones pruned to
        ``trainer.keep_checkpoints``. Returns its path or URL."""
        name, final = f"step_{step}", run_dir / "checkpoints" / f"step_{step}"
        remote = checkpoints.remote_run(self.cfg, run_dir)
        location = begin_checkpoint(remote, name) if remote is not None else str(checkpoints.begin(final))
        save_learner(location)
        plan = {"step": step, "total_steps": self.cfg.total_steps, "seed": self.cfg.seed}
        state = io.BytesIO()
        torch.save({**plan, "state": self.state_dict()}, state)
        write_file(location, TRAINER_STATE, state.getvalue(), self.cfg.storage_retry)
        if remote is not None:
            return commit_checkpoint(remote, name, json.dumps({**plan, "time": time.time()}).encode(),
                                     self.cfg.keep_checkpoints)
        checkpoints.commit(Path(location), final, plan)
        checkpoints.prune(run_dir, self.cfg.keep_checkpoints)
        return str(final)

    def export_location(self, run_dir: Path) -> str:
        """Where ``trainer.export`` writes the final policy: RUN_DIR/hf, on the store for a remote run_root (rank 0
        uploads it, wherever it runs)."""
        remote = checkpoints.remote_run(self.cfg, run_dir)
        return f"{remote.url}/hf" if remote is not None else str(run_dir / "hf")

    def resume(self, load_learner: Callable[[str], int]) -> int:
        """Load ``trainer.resume_from`` (already resolved to a checkpoint directory or URL, or empty): the learner
        group, then the driver's state; returns the step to continue from (0 without a checkpoint)."""
        if not self.cfg.resume_from:
            return 0
        start = load_learner(self.cfg.resume_from)
        state = read_file(self.cfg.resume_from, TRAINER_STATE, self.cfg.storage_retry)
        if state is not None:  # a checkpoint of the learner alone (a test fake, an older layout) has none
            saved = torch.load(io.BytesIO(state), weights_only=False)
            self._check_plan(saved, start)
            self.load_state_dict(saved["state"])
        return start

    def _check_plan(self, saved: dict[str, Any], start: int) -> None:
        """Say at start what differs from the run that wrote the checkpoint (it changes the numbers)."""
        if saved["total_steps"] != self.cfg.total_steps:
            log.warning("resuming at step %d a run planned for %d steps, now trainer.total_steps=%d: the "
                        "learning-rate schedule is re-planned over the new length (from step %d it follows the "
                        "new plan, not the old one)", start, saved["total_steps"], self.cfg.total_steps, start)
        if saved["seed"] != self.cfg.seed:
            log.warning("resuming a run seeded %d with trainer.seed=%d: prompts and data order follow the new "
                        "seed from step %d", saved["seed"], self.cfg.seed, start)
