"""Run a GRPO experiment for a benchmark: its step history, and where its start-up time went.

Shared by ``python -m toolbox.bench grpo`` (the default experiment) and its ``--vs trl`` mode (the
benchmark models). Start-up is split at the points the driver sees: Ray up (``ray.init``), each role's
group returned (placement group scheduled, actors created; for the learner also its process group joined and
every rank's model loaded), every actor ready (rollout and reward actors load while the learner ranks do), the
trainer built, the first weight sync done (``first_step_s``); the steps follow.

The run goes ``rollout.max_staleness`` untimed steps past the last reported one: with sampling ahead, the rollout
worker stops sampling that many steps before the run ends, so without this tail the last timed steps would train
with no generation competing for the cores and no weight sync, which a long run never sees. Their records are
dropped.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from toolbox.core.memory import PeakTreeMemory
from toolbox.driver.startup import tree_cpu_s

log = logging.getLogger(__name__)


@dataclass
class ExperimentRun:
    """What `run_experiment` measured: per-step metrics, start-up split (seconds), peak PSS of the process tree and
    its CPU seconds at each step's end."""

    history: list[dict[str, float]]
    rows_per_step: int
    startup: dict[str, float] = field(default_factory=dict)
    peak_pss_mib: float = 0.0
    settings: str = ""
    step_cpu_s: list[float] = field(default_factory=list)


def _timed_startup(builder: Any, startup: dict[str, float], t0: float) -> None:
    """Record, since ``t0``, when each role's group returned (created; ready too unless it starts without
    waiting) and when the builder's `started` returned (every actor ready), by wrapping the builder's methods."""
    make_group, started = builder.group, builder.started

    def group(role: str, *args: Any, **kwargs: Any) -> Any:
        out = make_group(role, *args, **kwargs)
        startup[f"{role}_group_s"] = time.perf_counter() - t0
        return out

    def all_started() -> None:
        started()
        startup.setdefault("actors_ready_s", time.perf_counter() - t0)

    builder.group, builder.started = group, all_started


def start_ray(cfg: Any, attempts: int = 5) -> None:
    """`connect_ray`, again (under the one retry policy) when a local raylet missed Ray's fixed 30 s registration
    window (a loaded machine); each failed start is shut down before the next."""
    import ray

    from toolbox.core.retry import RetryPolicy
    from toolbox.driver.ray_connect import connect_ray

    def start() -> None:
        try:
            connect_ray(cfg, log_to_driver=False)
        except Exception:
            ray.shutdown()
            raise

    RetryPolicy(attempts=attempts, first_pause_s=5.0, max_pause_s=20.0, deadline_s=600.0).call(
        start, what=f"Ray start-up (load average {os.getloadavg()[0]:.1f})",
        retryable=lambda err: "timed out during startup" in str(err))  # Ray raises a bare Exception for this one


def run_experiment(overrides: list[str], steps: int, warmup: int) -> ExperimentRun:
    """``toolbox.run`` with ``overrides`` for ``warmup + steps`` reported steps and the untimed tail (no evaluation,
    callbacks or samples log), on a fresh local Ray instance, shut down at the end."""
    import ray

    from toolbox.algorithms.grpo.config import GRPOConfig
    from toolbox.config import load_config
    from toolbox.core.events import Event
    from toolbox.driver.experiment import ExperimentBuilder

    t0 = time.perf_counter()
    run_root = tempfile.mkdtemp(prefix="bench-grpo-")
    fixed = ["trainer.eval_every=0", "callbacks=[]", "trainer.save_every=0", "trainer.log_samples_every=0",
             f"trainer.run_root={run_root}"]
    tail = load_config([*fixed, *overrides]).rollout.max_staleness
    cfg = load_config([f"trainer.total_steps={steps + warmup + tail}", *fixed, *overrides])
    if not isinstance(cfg.algorithm, GRPOConfig):
        raise SystemExit(f"bench grpo needs a grpo experiment, got algorithm.name={cfg.algorithm.name!r}")
    settings = (f"{cfg.rollout.num_workers} rollout x {cfg.rollout.torch_threads} thr, {cfg.reward.num_workers} "
                f"reward, {cfg.learner.num_workers} learner ({cfg.learner.strategy}) x {cfg.learner.torch_threads} "
                f"thr, placement {cfg.rollout.placement}")
    startup: dict[str, float] = {}
    step_cpu: list[float] = []
    builder = ExperimentBuilder(cfg)
    with PeakTreeMemory() as memory:
        start_ray(cfg)
        try:
            startup["ray_init_s"] = time.perf_counter() - t0
            _timed_startup(builder, startup, t0)
            trainer = builder.build_trainer()
            startup["trainer_built_s"] = time.perf_counter() - t0
            trainer.bus.subscribe(Event.FIT_START,
                                  lambda *_: startup.__setitem__("first_step_s", time.perf_counter() - t0))
            trainer.bus.subscribe(Event.STEP_END, lambda *_: step_cpu.append(tree_cpu_s()))
            trainer.fit()
            memory.sample()
        finally:
            builder.shutdown()
            ray.shutdown()
    reported = steps + warmup
    return ExperimentRun(trainer.history[:reported], cfg.algorithm.rollouts_per_step, startup, memory.peak_mib,
                         settings + f", {tail} untimed tail steps", step_cpu[:reported])
