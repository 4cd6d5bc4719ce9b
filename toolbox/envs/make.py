"""Gymnasium environments: make one, check its spaces against what the PPO stack supports, vector envs.

Supported: a ``Box`` observation space (any shape; flattened for the MLP, or an
``(H, W, C)`` image for the CNN encoder), and ``Dict``, ``Tuple``, ``Discrete``,
``MultiDiscrete`` and ``MultiBinary`` observations, which `make_env` flattens into one
vector with gymnasium's ``FlattenObservation`` (discrete parts one-hot); a ``Discrete``
or 1-D ``Box`` action space. Anything else (Text, Graph or Sequence observations,
MultiDiscrete actions, ...) is refused before any actor starts.

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
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from toolbox.core.errors import ConfigError
from toolbox.core.extras import needs_extra
from toolbox.envs.config import EnvConfig
from toolbox.models.mlp import SpaceSpec

FLATTENED = ("Dict", "Tuple", "Discrete", "MultiDiscrete", "MultiBinary")  # observation spaces made one vector


def make_env(cfg: EnvConfig) -> Any:
    """One ``gymnasium.make(cfg.id, **cfg.kwargs)``, its observations flattened when their space is one of
    `FLATTENED`; an unknown id or bad kwargs becomes a `ConfigError`."""
    import gymnasium as gym
    from gymnasium.wrappers import FlattenObservation

    try:
        env = gym.make(cfg.id, **cfg.kwargs)
    except gym.error.DependencyNotInstalled as err:  # MuJoCo, Box2D: say which of our extras brings it
        entry = str(gym.spec(cfg.id).entry_point)
        extra = next((e for e in ("mujoco", "box2d") if e in entry.lower()), None)
        raise ConfigError(needs_extra(f"env.id={cfg.id}", extra, str(err)) if extra
                          else f"env.id: cannot make {cfg.id!r}: {err}") from None
    except gym.error.Error as err:
        raise ConfigError(f"env.id: cannot make {cfg.id!r}: {err}") from None
    except TypeError as err:
        raise ConfigError(f"env.kwargs: {cfg.id!r} rejects {sorted(cfg.kwargs)}: {err}") from None
    if type(env.observation_space).__name__ in FLATTENED:
        return FlattenObservation(env)
    return env


def spec_of(obs_space: Any, action_space: Any, env_id: str = "") -> SpaceSpec:
    """The `SpaceSpec` of a pair of gymnasium spaces, or a `ConfigError` naming the env and the space."""
    from gymnasium import spaces

    if not isinstance(obs_space, spaces.Box) or not obs_space.shape:
        raise ConfigError(f"env.id={env_id}: observation space {obs_space} is not supported; the ppo_env trainer "
                          f"needs a Box observation space, or one of {', '.join(FLATTENED)} (flattened)")
    shape = tuple(int(x) for x in obs_space.shape)
    obs_dim = math.prod(shape)
    # uint8 pixels are scaled to [0, 1] by the CNN encoder (the running-stats normalisation is for vectors)
    scale = 1 / 255 if obs_space.dtype == np.uint8 else 1.0
    if isinstance(action_space, spaces.Discrete):
        return SpaceSpec(obs_dim, "discrete", int(action_space.n), action_start=int(action_space.start),
                         obs_shape=shape, pixel_scale=scale)
    if isinstance(action_space, spaces.Box) and len(action_space.shape) == 1:
        low, high = (tuple(float(x) for x in bound) for bound in (action_space.low, action_space.high))
        return SpaceSpec(obs_dim, "continuous", int(action_space.shape[0]), low=low, high=high, obs_shape=shape,
                         pixel_scale=scale)
    raise ConfigError(f"env.id={env_id}: action space {action_space} is not supported; "
                      "the ppo_env trainer handles Discrete and 1-D Box action spaces")


def check_env(cfg: EnvConfig) -> SpaceSpec:
    """Make the env once and check its spaces; returns their `SpaceSpec`. Run before any actor starts."""
    env = make_env(cfg)
    try:
        return spec_of(env.observation_space, env.action_space, cfg.id)
    finally:
        env.close()


def make_vector_env(cfg: EnvConfig, num_envs: int | None = None, env_fns: list[Callable[[], Any]] | None = None) -> Any:
    """A gymnasium vector env of ``num_envs`` (default ``cfg.num_envs``) copies in SAME_STEP autoreset mode.

    ``SyncVectorEnv`` or ``AsyncVectorEnv`` as ``cfg.vectorization`` says: classic-control envs
    step in microseconds, so subprocesses would cost more than they save (parallelism comes
    from several runner actors); a MuJoCo step costs about as much as the pipe round trip.
    ``env_fns`` replaces how the copies are made (the env runner wraps them to snapshot them).
    """
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

    fns = env_fns or [partial(make_env, cfg) for _ in range(num_envs or cfg.num_envs)]
    vector_cls = AsyncVectorEnv if cfg.vectorization == "async" else SyncVectorEnv
    envs = vector_cls(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    mode = envs.metadata.get("autoreset_mode")
    if mode != AutoresetMode.SAME_STEP:  # a gymnasium that ignores the argument would silently mis-bootstrap
        envs.close()
        raise RuntimeError(f"env.id={cfg.id}: vector env autoreset mode is {mode}, expected SAME_STEP")
    return envs
