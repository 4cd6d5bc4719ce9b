"""Gymnasium environments: make one, check its spaces against what the PPO stack supports, vector envs.

Supported: a ``Box`` observation space (any shape; flattened for the MLP) and a
``Discrete`` or 1-D ``Box`` action space. Anything else (Dict, Tuple, MultiDiscrete,
image observations meant for a CNN, ...) is refused before any actor starts.

Vector envs use gymnasium's ``SAME_STEP`` autoreset: when an episode ends, ``step``
returns the first observation of the next episode and puts the last one in
``info["final_obs"]``. That is what truncation bootstrapping needs (the value of the
final observation), with no dummy reset step to mask out as in the default
``NEXT_STEP`` mode.

Not here: the `env` config section (`toolbox.envs.config`) and `SpaceSpec`, which
belongs to the policy it describes (`toolbox.models.mlp`).
"""

from __future__ import annotations

import math
from typing import Any

from toolbox.core.errors import ConfigError
from toolbox.envs.config import EnvConfig
from toolbox.models.mlp import SpaceSpec


def make_env(cfg: EnvConfig) -> Any:
    """One ``gymnasium.make(cfg.id, **cfg.kwargs)``; an unknown id or bad kwargs becomes a `ConfigError`."""
    import gymnasium as gym

    try:
        return gym.make(cfg.id, **cfg.kwargs)
    except gym.error.Error as err:
        raise ConfigError(f"env.id: cannot make {cfg.id!r}: {err}") from None
    except TypeError as err:
        raise ConfigError(f"env.kwargs: {cfg.id!r} rejects {sorted(cfg.kwargs)}: {err}") from None


def spec_of(obs_space: Any, action_space: Any, env_id: str = "") -> SpaceSpec:
    """The `SpaceSpec` of a pair of gymnasium spaces, or a `ConfigError` naming the env and the space."""
    from gymnasium import spaces

    if not isinstance(obs_space, spaces.Box) or not obs_space.shape:
        raise ConfigError(f"env.id={env_id}: observation space {obs_space} is not supported; "
                          "the ppo_env trainer needs a Box observation space (flattened into an MLP)")
    obs_dim = math.prod(obs_space.shape)
    if isinstance(action_space, spaces.Discrete):
        return SpaceSpec(obs_dim, "discrete", int(action_space.n), action_start=int(action_space.start))
    if isinstance(action_space, spaces.Box) and len(action_space.shape) == 1:
        low, high = (tuple(float(x) for x in bound) for bound in (action_space.low, action_space.high))
        return SpaceSpec(obs_dim, "continuous", int(action_space.shape[0]), low=low, high=high)
    raise ConfigError(f"env.id={env_id}: action space {action_space} is not supported; "
                      "the ppo_env trainer handles Discrete and 1-D Box action spaces")


def check_env(cfg: EnvConfig) -> SpaceSpec:
    """Make the env once and check its spaces; returns their `SpaceSpec`. Run before any actor starts."""
    env = make_env(cfg)
    try:
        return spec_of(env.observation_space, env.action_space, cfg.id)
    finally:
        env.close()


def make_vector_env(cfg: EnvConfig, num_envs: int | None = None) -> Any:
    """A ``SyncVectorEnv`` of ``num_envs`` (default ``cfg.num_envs``) copies in SAME_STEP autoreset mode.

    Synchronous on purpose: classic-control envs step in microseconds, so subprocesses
    would cost more than they save; parallelism comes from several runner actors.
    """
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    n = num_envs or cfg.num_envs
    envs = SyncVectorEnv([lambda: make_env(cfg) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP)
    mode = envs.metadata.get("autoreset_mode")
    if mode != AutoresetMode.SAME_STEP:  # a gymnasium that ignores the argument would silently mis-bootstrap
        raise RuntimeError(f"env.id={cfg.id}: vector env autoreset mode is {mode}, expected SAME_STEP")
    return envs
