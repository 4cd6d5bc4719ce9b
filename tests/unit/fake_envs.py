"""Tiny gymnasium envs for the classic-RL tests: a counter whose episodes end on a time limit or a terminal state."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

COUNTER_TRUNCATE = "toolbox-test/CounterTruncate-v0"
COUNTER_TERMINATE = "toolbox-test/CounterTerminate-v0"
DICT_OBS = "toolbox-test/DictObs-v0"


class CounterEnv(gym.Env):
    """Observation ``[t]``, reward 1 per step; after ``horizon`` steps the episode ends (terminated or truncated)."""

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, horizon: int = 3, terminate: bool = False) -> None:
        self.horizon, self.terminate, self.t = horizon, terminate, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        end = self.t >= self.horizon
        return np.array([float(self.t)], np.float32), 1.0, end and self.terminate, end and not self.terminate, {}


class DictObsEnv(CounterEnv):
    """The counter with a Dict observation space, which the ppo_env stack refuses."""

    observation_space = spaces.Dict({"t": spaces.Box(-np.inf, np.inf, (1,), np.float32)})


def register_fake_envs() -> None:
    for env_id, kwargs, cls in ((COUNTER_TRUNCATE, {"terminate": False}, CounterEnv),
                                (COUNTER_TERMINATE, {"terminate": True}, CounterEnv), (DICT_OBS, {}, DictObsEnv)):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=cls, kwargs=kwargs, disable_env_checker=True)
