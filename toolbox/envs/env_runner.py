"""`EnvRunner`: steps a gymnasium vector env with the current policy and records a `TrajectoryBatch`.

Plain Python + torch; `toolbox.actors.env_runner.EnvRunnerWorker` makes it a Ray actor.

Episode boundaries follow gymnasium's SAME_STEP autoreset (see `toolbox.envs.make`):
on a truncation (a time limit) the runner evaluates ``V(final observation)`` so the
learner can bootstrap from it; on a termination there is nothing to bootstrap.
The copies step in the runner's process or each in a subprocess (``env.vectorization``).
Episodes run on across rollouts, and a checkpoint keeps them (`get_state`): the env copies
(pickled, with their own RNGs, by `SnapshotEnv` wherever they run), the current observations,
the episode tallies and the action-sampling generator, so a resumed run continues the very
same episodes. An env that cannot be pickled is the exception: a resumed run then starts
fresh episodes (it says so).

Per step the runner does one batched policy forward for all copies, in numpy for MLP policies
(`toolbox.envs.step_policy`: torch's per-op dispatch cost more than the arithmetic at this size); the
per-step records (policy outputs, rewards, dones, returns, raw observations) stay numpy arrays that
become tensors once per rollout, not once per step.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from toolbox.envs.config import EnvConfig
from toolbox.envs.make import make_env, make_vector_env
from toolbox.envs.step_policy import step_policy
from toolbox.envs.trajectory import TrajectoryBatch
from toolbox.models.mlp import ActorCritic, PolicyConfig, SpaceSpec
from toolbox.models.running_stats import moments
from toolbox.rl.weights import WeightBucket, load_into

log = logging.getLogger(__name__)


@dataclass
class Episodes:
    """Returns and lengths of the episodes that finished during one rollout (raw, unscaled rewards)."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


class SnapshotEnv(gym.Wrapper):
    """An env copy as a runner steps it: it can hand back a pickled copy of what it wraps, through
    ``vector_env.call("snapshot")``, whether it steps in the runner's process or in an `AsyncVectorEnv`
    subprocess; and its ``step`` returns an empty info dict.

    Why drop the info: the runner reads nothing from it (the ``final_obs`` it bootstraps from is added by the
    vector env), yet the vector env merges every copy's info into per-key arrays at every step; for MuJoCo
    envs (four floats of info per step) that merge was about a tenth of a runner's CPU time per step.
    """

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return obs, reward, terminated, truncated, {}

    def snapshot(self) -> tuple[bytes | None, str]:
        """``(pickled env, "")``, or ``(None, why)``: an exception raised here would end an async worker."""
        try:
            return pickle.dumps(self.env), ""
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            return None, str(err)


def fresh_copy(cfg: EnvConfig) -> SnapshotEnv:
    """A new env copy (module-level, so an `AsyncVectorEnv` subprocess can be handed it)."""
    return SnapshotEnv(make_env(cfg))


def restored_copy(env: Any) -> SnapshotEnv:
    """An env copy unpickled from a checkpoint, wrapped again to be snapshot later."""
    return SnapshotEnv(env)


class EnvRunner:
    """One runner: ``env.num_envs`` copies of the env, a CPU copy of the policy, its own RNG."""

    def __init__(self, env: EnvConfig, policy: PolicyConfig, spec: SpaceSpec, gamma: float, seed: int) -> None:
        self.env_cfg, self.gamma = env, gamma
        # Its initial weights are replaced by the learner's before the first rollout; built on a fork of the global
        # RNG so that a runner sharing a process with a learner rank (ray.local_mode) leaves that rank's draws alone
        with torch.random.fork_rng():
            self.model = ActorCritic(spec, policy).eval().requires_grad_(False)
        self.policy = step_policy(self.model)
        self.envs = make_vector_env(env, env_fns=[partial(fresh_copy, env) for _ in range(env.num_envs)])
        self.generator = torch.Generator().manual_seed(seed)
        self.obs, _ = self.envs.reset(seed=seed)
        n = env.num_envs
        self.ep_return, self.ep_len = np.zeros(n), np.zeros(n, dtype=np.int64)
        self.discounted = np.zeros(n)
        self._eval_envs: Any = None

    def get_state(self) -> dict[str, Any]:
        """Everything the next rollout depends on besides the weights (picklable, for a checkpoint)."""
        snapshots = self.envs.call("snapshot")
        envs: list[bytes] | None = [blob for blob, _ in snapshots]
        errors = sorted({why for _, why in snapshots if why})
        if errors:
            log.warning("env.id=%s: its state cannot be pickled (%s); a run resumed from this checkpoint starts "
                        "fresh episodes", self.env_cfg.id, "; ".join(errors))
            envs = None
        return {"envs": envs, "obs": self.obs, "ep_return": self.ep_return.copy(), "ep_len": self.ep_len.copy(),
                "discounted": self.discounted.copy(), "generator": self.generator.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from what `get_state` returned (episodes in progress included, where the env was picklable)."""
        self.generator.set_state(state["generator"])
        if state["envs"] is None:
            return
        if len(state["ep_len"]) != self.env_cfg.num_envs:
            log.warning("env.num_envs is %d, the checkpoint has %d env copies per runner: fresh episodes start",
                        self.env_cfg.num_envs, len(state["ep_len"]))
            return
        blobs = state["envs"]  # one blob per copy; checkpoints written before SnapshotEnv hold one of the whole list
        copies = pickle.loads(blobs) if isinstance(blobs, bytes) else [pickle.loads(b) for b in blobs]
        self.envs.close()  # SAME_STEP autoreset keeps no per-step state in the vector env itself
        self.envs = make_vector_env(self.env_cfg, env_fns=[partial(restored_copy, env) for env in copies])
        self.obs = state["obs"]
        self.ep_return, self.ep_len, self.discounted = state["ep_return"], state["ep_len"], state["discounted"]

    def load_weights(self, buckets: list[WeightBucket]) -> int:
        """Copy the learner's exported weights (and normalisation statistics) into the policy."""
        loaded = load_into(self.model, buckets)
        self.policy = step_policy(self.model)  # load_into may re-point parameters at new (shared) memory
        return loaded

    @torch.no_grad()
    def rollout(self, num_steps: int) -> tuple[TrajectoryBatch, Episodes]:
        """``num_steps`` steps of every env copy with sampled actions."""
        n, obs_dim = self.env_cfg.num_envs, self.model.spec.obs_dim
        buf = _Buffers.empty(num_steps, n, obs_dim)
        episodes = Episodes()
        policy = self.policy
        for t in range(num_steps):
            buf.raw_obs_TNO[t] = np.reshape(self.obs, (n, obs_dim))
            x = policy.prepare_obs(self.obs)
            actions, logp, value = policy.act(x, generator=self.generator)
            self.obs, reward, terminated, truncated, info = self.envs.step(policy.env_actions(actions))
            buf.record(t, (x, actions, logp, value), reward, terminated, truncated)
            done = terminated | truncated
            if done.any():
                bootstrap = truncated & ~terminated  # a step that is both is a termination: nothing to bootstrap
                if bootstrap.any():
                    buf.final_values_TN[t] = self._final_values(info, bootstrap)
            self._track(reward, done, buf.discounted_TN[t], episodes)
        mean, var, count = moments(torch.from_numpy(buf.raw_obs_TNO.reshape(-1, obs_dim)))
        last_value = torch.from_numpy(policy.value(policy.prepare_obs(self.obs)))
        return buf.batch(last_value, mean, var, count), episodes

    def _final_values(self, info: dict[str, Any], where: np.ndarray) -> np.ndarray:
        """``V(final obs)`` where an episode was truncated this step, 0 elsewhere."""
        idx = np.flatnonzero(where)
        final = np.stack([np.asarray(info["final_obs"][i], dtype=np.float32) for i in idx])
        out = np.zeros(len(where), np.float32)
        out[idx] = self.policy.value(self.policy.prepare_obs(final))
        return out

    def _track(self, reward: np.ndarray, done: np.ndarray, discounted_out: np.ndarray, episodes: Episodes) -> None:
        """Episode returns/lengths, and the per-env discounted return that reward scaling divides by."""
        self.ep_return += reward
        self.ep_len += 1
        self.discounted = self.discounted * self.gamma + reward
        discounted_out[:] = self.discounted
        if done.any():
            for i in np.flatnonzero(done):
                episodes.returns.append(float(self.ep_return[i]))
                episodes.lengths.append(int(self.ep_len[i]))
            self.ep_return[done], self.ep_len[done], self.discounted[done] = 0.0, 0, 0.0

    @torch.no_grad()
    def evaluate(self, num_episodes: int, seed: int) -> list[float]:
        """Returns of ``num_episodes`` episodes (one per env copy, seeds ``seed + i``) with the deterministic policy."""
        if num_episodes <= 0:
            return []
        if self._eval_envs is None or self._eval_envs.num_envs != num_episodes:
            if self._eval_envs is not None:
                self._eval_envs.close()
            self._eval_envs = make_vector_env(self.env_cfg, num_episodes)
        obs, _ = self._eval_envs.reset(seed=seed)
        returns, done = np.zeros(num_episodes), np.zeros(num_episodes, dtype=bool)
        while not done.all():
            actions, _, _ = self.policy.act(self.policy.prepare_obs(obs), deterministic=True)
            obs, reward, terminated, truncated, _ = self._eval_envs.step(self.policy.env_actions(actions))
            returns += np.where(done, 0.0, reward)
            done |= terminated | truncated
        return returns.tolist()

    def close(self) -> None:
        self.envs.close()
        if self._eval_envs is not None:
            self._eval_envs.close()


@dataclass
class _Buffers:
    """One rollout's ``[T, N]`` records: numpy arrays for what the env returned (written in place each step) and
    lists of the policy's per-step arrays; `batch` makes both tensors once per rollout, not once per step."""

    policy: list[tuple[np.ndarray, ...]]  # per step: (obs_NO, actions_N[A], logp_N, values_N)
    final_values_TN: np.ndarray
    rewards_TN: np.ndarray
    terminated_TN: np.ndarray
    truncated_TN: np.ndarray
    discounted_TN: np.ndarray
    raw_obs_TNO: np.ndarray  # float64, for the observation moments

    @staticmethod
    def empty(t: int, n: int, obs_dim: int) -> _Buffers:
        return _Buffers([], np.zeros((t, n), np.float32), np.zeros((t, n), np.float32), np.zeros((t, n), bool),
                        np.zeros((t, n), bool), np.zeros((t, n), np.float32), np.zeros((t, n, obs_dim)))

    def record(self, t: int, policy: tuple[np.ndarray, ...], reward: np.ndarray, terminated: np.ndarray,
               truncated: np.ndarray) -> None:
        self.policy.append(policy)
        self.rewards_TN[t], self.terminated_TN[t], self.truncated_TN[t] = reward, terminated, truncated

    def batch(self, last_value_N: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, count: float) -> TrajectoryBatch:
        obs_TNO, actions_TN, logp_TN, values_TN = (torch.from_numpy(np.stack(column)) for column in zip(*self.policy))
        return TrajectoryBatch(
            obs_TNO=obs_TNO, actions_TN=actions_TN, logp_TN=logp_TN, values_TN=values_TN,
            rewards_TN=torch.from_numpy(self.rewards_TN), terminated_TN=torch.from_numpy(self.terminated_TN),
            truncated_TN=torch.from_numpy(self.truncated_TN), final_values_TN=torch.from_numpy(self.final_values_TN),
            last_value_N=last_value_N, discounted_returns_TN=torch.from_numpy(self.discounted_TN),
            obs_mean_O=mean, obs_var_O=var, obs_count=count)
