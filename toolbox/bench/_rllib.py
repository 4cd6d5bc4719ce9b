"""What the benchmarks that run RLlib beside us share: is it installed, and its training loop with a stop rule.

RLlib is only a yardstick here (the ``bench`` extra); nothing in the platform imports it.
Figures are read from RLlib's result dicts of the new API stack:
``num_env_steps_sampled_lifetime`` and ``env_runners/episode_return_mean``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, TextIO


def rllib_available() -> bool:
    try:
        import ray.rllib  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class RLlibRun:
    """One RLlib training run: steps, whether it stopped on its target, and the timings."""

    env_steps: int = 0
    reached: bool = False
    train_s: float = 0.0
    startup_s: float = 0.0
    curve: list[dict[str, float]] = field(default_factory=list)  # per iteration: env_steps, wall_s, episode_return


def result_point(result: dict[str, Any], wall_s: float, previous: dict[str, float] | None = None) -> dict[str, float]:
    """Env steps so far, seconds since training began, the smoothed training return and the finished episodes of
    one ``algo.train()``.

    RLlib 2.60 puts ``env_runners/episode_return_mean`` in a result only when an episode ended during that
    iteration. Where episodes all last as long (HalfCheetah: 1,000 steps, ended by the time limit, every env copy
    in step) that is one iteration in sixteen, so the return of the ``previous`` point stands until the next one
    comes; it is NaN only before any episode finished. (The key may also be there with a NaN value: the same.)"""
    runners = result.get("env_runners", {})
    steps = runners.get("num_env_steps_sampled_lifetime") or result.get("num_env_steps_sampled_lifetime") or 0
    ret = runners.get("episode_return_mean")
    held = previous["episode_return"] if previous is not None else math.nan
    fresh = ret is not None and not math.isnan(ret)
    return {"env_steps": float(steps), "wall_s": wall_s, "episode_return": float(ret) if fresh else held,
            "episodes": float(runners.get("num_episodes_lifetime") or 0)}


def train_rllib(config: Any, max_steps: int, target: float | None = None, log: TextIO | None = None,
                max_wall_s: float = math.inf) -> RLlibRun:
    """Build ``config``'s algorithm and call ``train()`` until ``max_steps`` env steps, ``max_wall_s`` seconds or
    a smoothed training return of ``target``; every iteration's point is kept (and written to ``log`` as JSONL)."""
    t0 = time.perf_counter()
    algo = config.build_algo()
    run = RLlibRun(startup_s=time.perf_counter() - t0)
    t1 = time.perf_counter()
    try:
        while run.env_steps < max_steps and not run.reached and time.perf_counter() - t1 < max_wall_s:
            point = result_point(algo.train(), time.perf_counter() - t1, run.curve[-1] if run.curve else None)
            run.curve.append(point)
            run.env_steps = int(point["env_steps"])
            run.reached = target is not None and point["episode_return"] >= target  # NaN compares False
            if log is not None:
                log.write(json.dumps(point) + "\n")
                log.flush()
        run.train_s = time.perf_counter() - t1
    finally:
        algo.stop()
    return run


def init_ray(min_cpus: int = 4) -> None:
    """A local Ray instance with at least ``min_cpus`` logical CPUs: RLlib's env runners and its learner must fit
    their CPU requests; the real cores are what they are."""
    import os

    import ray

    ray.init(num_cpus=max(min_cpus, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
