"""Where one env runner's step goes: the env itself, the policy forward, and the runner's own bookkeeping.

In-process (no Ray), one `EnvRunner` with the benchmark's policy (two 64-64 tanh MLPs), one thread. Three
timings in CPU microseconds (the thread's own time, so a loaded machine skews them far less than wall time)
per vector step of ``num_envs`` copies: the vector env stepped with precomputed
random actions; the runner's policy step (``prepare_obs`` + ``act`` + ``env_actions`` of its
`toolbox.envs.step_policy`, numpy for an MLP) on a fixed observation batch, and beside it the same step
through `ActorCritic`'s torch forward (what a CNN policy steps through); a whole ``rollout``. What the
whole rollout costs beyond the env and the policy step is the runner's overhead (buffers, episode
tallies, bootstrapping values on truncation).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    fn()  # warm-up
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t0) / calls * 1e6


def breakdown(env_id: str, num_envs: int, steps: int) -> dict[str, float]:
    """``{"env_us", "policy_us", "torch_policy_us", "runner_us", "overhead_us"}`` per vector step of ``num_envs``
    copies."""
    from toolbox.envs.config import EnvConfig
    from toolbox.envs.env_runner import EnvRunner
    from toolbox.envs.make import check_env
    from toolbox.models.mlp import PolicyConfig

    torch.set_num_threads(1)  # as in the runner actors
    env = EnvConfig(id=env_id, num_envs=num_envs)
    runner = EnvRunner(env, PolicyConfig(hidden_sizes=[64, 64]), check_env(env), gamma=0.99, seed=0)
    try:
        space = runner.envs.action_space
        space.seed(0)
        actions = [space.sample() for _ in range(steps + 1)]
        it = iter(actions)
        env_us = per_call_us(lambda: runner.envs.step(next(it)), steps)
        obs, policy, model = runner.obs, runner.policy, runner.model

        def numpy_step() -> None:
            policy.env_actions(policy.act(policy.prepare_obs(obs), generator=runner.generator)[0])

        def torch_step() -> None:
            with torch.inference_mode():
                model.env_actions(model.act(model.prepare_obs(obs), generator=runner.generator)[0])

        policy_us = per_call_us(numpy_step, steps)
        torch_policy_us = per_call_us(torch_step, steps)
        runner_us = per_call_us(lambda: runner.rollout(steps), 1) / steps
    finally:
        runner.close()
    return {"env_us": env_us, "policy_us": policy_us, "torch_policy_us": torch_policy_us, "runner_us": runner_us,
            "overhead_us": float(np.maximum(runner_us - env_us - policy_us, 0.0))}


def print_breakdown(env_ids: list[str], num_envs: int, steps: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    print(f"one runner, {num_envs} envs, per vector step (us): env step | policy step | (torch forward) | "
          "whole runner step | overhead")
    for env_id in env_ids:
        b = breakdown(env_id, num_envs, steps)
        out.append({"env": env_id, **b})
        print(f"  {env_id:<18} {b['env_us']:>8.0f} | {b['policy_us']:>8.0f} | ({b['torch_policy_us']:>6.0f}) | "
              f"{b['runner_us']:>8.0f} | {b['overhead_us']:>8.0f}")
    return out
