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
    """The counter with a Dict observation space (flattened by `toolbox.envs.make.make_env`)."""

    observation_space = spaces.Dict({"t": spaces.Box(-np.inf, np.inf, (1,), np.float32)})


class TextObsEnv(CounterEnv):
    """The counter with a Text observation space, which the ppo_env stack refuses (nothing to flatten it into)."""

    observation_space = spaces.Text(5)


CUE = {kind: f"toolbox-test/Cue{kind.title()}-v0" for kind in ("dict", "tuple", "image")}
CUE_SPACES = {
    "dict": spaces.Dict({"cue": spaces.Discrete(2), "noise": spaces.Box(-1, 1, (2,), np.float32)}),
    "tuple": spaces.Tuple((spaces.Box(-1, 1, (1,), np.float32), spaces.Discrete(2))),
    "image": spaces.Box(0, 255, (6, 6, 1), np.uint8),
}


class CueEnv(gym.Env):
    """Each step shows a random cue (0 or 1) and pays 1 when the action names it; 8-step episodes (truncated).

    The cue sits in a Dict, in a Tuple beside noise, or in an image (the left or the right half lit), so
    a policy learns the task only if that observation space reaches it intact (a random policy earns 0.5).
    """

    action_space = spaces.Discrete(2)

    def __init__(self, kind: str = "dict") -> None:
        self.kind, self.observation_space, self.t, self.cue = kind, CUE_SPACES[kind], 0, 0

    def _obs(self) -> Any:
        self.cue = int(self.np_random.integers(2))
        noise = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        if self.kind == "dict":
            return {"cue": self.cue, "noise": noise}
        if self.kind == "tuple":
            return noise[:1], self.cue
        image = np.zeros((6, 6, 1), np.uint8)
        image[:, 3 * self.cue : 3 * self.cue + 3] = 255
        return image

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        reward = float(int(action) == self.cue)
        self.t += 1
        return self._obs(), reward, False, self.t >= 8, {}


TEXT_OBS = "toolbox-test/TextObs-v0"


def register_fake_envs() -> None:
    for env_id, kwargs, cls in ((COUNTER_TRUNCATE, {"terminate": False}, CounterEnv),
                                (COUNTER_TERMINATE, {"terminate": True}, CounterEnv), (DICT_OBS, {}, DictObsEnv),
                                (TEXT_OBS, {}, TextObsEnv), *((CUE[k], {"kind": k}, CueEnv) for k in CUE)):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=cls, kwargs=kwargs, disable_env_checker=True)
