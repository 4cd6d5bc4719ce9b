"""`EnvRunner`: SAME_STEP autoreset, V(final obs) on truncation (not on termination), episode stats, evaluation;
sync and async vector envs give the same rollouts, and a runner's state resumes its episodes with either."""

from __future__ import annotations

import pickle
import threading
from dataclasses import fields

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

from tests.unit.fake_envs import COUNTER_TERMINATE, COUNTER_TRUNCATE, CounterEnv, register_fake_envs
from toolbox.envs.config import EnvConfig
from toolbox.envs.env_runner import EnvRunner
from toolbox.envs.make import check_env
from toolbox.envs.trajectory import TrajectoryBatch
from toolbox.models.mlp import PolicyConfig

UNPICKLABLE = "toolbox-test/Unpicklable-v0"


@pytest.fixture(autouse=True)
def fake_envs() -> None:
    register_fake_envs()


def make_runner(env_id: str, num_envs: int = 2, normalize: bool = False, vectorization: str = "sync",
                seed: int = 0) -> EnvRunner:
    env = EnvConfig(id=env_id, num_envs=num_envs, vectorization=vectorization)  # type: ignore[arg-type]
    return EnvRunner(env, PolicyConfig(hidden_sizes=[8], normalize_obs=normalize), check_env(env), gamma=0.5, seed=seed)


def test_truncation_records_the_value_of_the_final_observation() -> None:
    runner = make_runner(COUNTER_TRUNCATE)
    batch, episodes = runner.rollout(7)  # episodes of 3 steps: ends at t = 2 and t = 5
    v_final = runner.model.value(torch.tensor([[3.0]]))  # the final obs of every episode is [3]
    ended = torch.tensor([False, False, True, False, False, True, False])
    for t in range(7):
        assert torch.equal(batch.truncated_TN[t], ended[t].repeat(2))
        expected = v_final.repeat(2) if ended[t] else torch.zeros(2)
        assert torch.allclose(batch.final_values_TN[t], expected)
    assert not batch.terminated_TN.any()
    # SAME_STEP: the step after an ending starts the next episode from its first observation.
    assert batch.obs_TNO[:, 0, 0].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert episodes.returns == [3.0] * 4 and episodes.lengths == [3] * 4
    assert torch.allclose(batch.last_value_N, runner.model.value(torch.tensor([[1.0], [1.0]])))


def test_termination_has_nothing_to_bootstrap() -> None:
    runner = make_runner(COUNTER_TERMINATE)
    batch, _ = runner.rollout(6)
    assert batch.terminated_TN[:, 0].tolist() == [False, False, True, False, False, True]
    assert not batch.truncated_TN.any()
    assert torch.equal(batch.final_values_TN, torch.zeros(6, 2))


def test_behaviour_logp_and_values_match_the_policy() -> None:
    runner = make_runner(COUNTER_TRUNCATE)
    batch, _ = runner.rollout(5)
    obs, actions = batch.obs_TNO.reshape(10, 1), batch.actions_TN.reshape(10)
    logp, _, values = runner.model(obs, actions)
    assert torch.allclose(logp, batch.logp_TN.reshape(10)) and torch.allclose(values, batch.values_TN.reshape(10))


def test_discounted_returns_and_raw_observation_moments() -> None:
    runner = make_runner(COUNTER_TRUNCATE, num_envs=1, normalize=True)
    batch, _ = runner.rollout(4)
    # gamma 0.5, reward 1, reset after 3 steps: 1, 1.5, 1.75, then a new episode: 1.
    assert batch.discounted_returns_TN[:, 0].tolist() == [1.0, 1.5, 1.75, 1.0]
    raw = torch.tensor([0.0, 1.0, 2.0, 0.0], dtype=torch.float64)
    assert torch.allclose(batch.obs_mean_O, raw.mean().reshape(1)) and batch.obs_count == 4
    assert torch.allclose(batch.obs_var_O, raw.var(unbiased=False).reshape(1))


def test_same_seed_same_rollout() -> None:
    a, b = make_runner("CartPole-v1"), make_runner("CartPole-v1")
    ba, _ = a.rollout(20)
    bb, _ = b.rollout(20)
    assert torch.equal(ba.actions_TN, bb.actions_TN) and torch.equal(ba.obs_TNO, bb.obs_TNO)


def test_evaluate_counts_one_episode_per_env_copy() -> None:
    runner = make_runner(COUNTER_TRUNCATE)
    assert runner.evaluate(5, seed=123) == [3.0] * 5
    assert runner.evaluate(0, seed=1) == []


def with_weights_of(runner: EnvRunner, other: EnvRunner) -> EnvRunner:
    """``other`` with ``runner``'s policy weights (each draws its initial weights from the global RNG)."""
    other.model.load_state_dict(runner.model.state_dict())
    return other


def same_batches(a: TrajectoryBatch, b: TrajectoryBatch) -> bool:
    return all(torch.equal(getattr(a, f.name), getattr(b, f.name)) for f in fields(TrajectoryBatch)
               if f.name != "obs_count")


@pytest.mark.parametrize("env_id", [COUNTER_TRUNCATE, "CartPole-v1"])
def test_async_vector_env_gives_the_sync_rollout(env_id: str) -> None:
    sync = make_runner(env_id, num_envs=3)
    asynchronous = with_weights_of(sync, make_runner(env_id, num_envs=3, vectorization="async"))
    try:
        assert isinstance(sync.envs, SyncVectorEnv) and isinstance(asynchronous.envs, AsyncVectorEnv)
        (a, ep_a), (b, ep_b) = sync.rollout(40), asynchronous.rollout(40)
        assert same_batches(a, b) and ep_a == ep_b and ep_a.returns  # episodes ended (and were bootstrapped) alike
    finally:
        sync.close()
        asynchronous.close()


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_state_resumes_the_episodes_in_progress(vectorization: str) -> None:
    whole = make_runner("CartPole-v1", vectorization=vectorization)
    # other envs and another RNG until set_state; the weights would come from the learner's checkpoint
    resumed = with_weights_of(whole, make_runner("CartPole-v1", vectorization=vectorization, seed=7))
    try:
        whole.rollout(13)  # mid-episode: CartPole's first episodes last longer than 13 steps
        state = pickle.loads(pickle.dumps(whole.get_state()))  # as a checkpoint carries it
        assert state["envs"] is not None and len(state["envs"]) == 2
        resumed.set_state(state)
        assert type(resumed.envs) is type(whole.envs)
        (a, ep_a), (b, ep_b) = whole.rollout(30), resumed.rollout(30)
        assert same_batches(a, b) and ep_a == ep_b and ep_a.lengths and min(ep_a.lengths) > 13
    finally:
        whole.close()
        resumed.close()


class UnpicklableEnv(CounterEnv):
    """The counter holding a lock, which pickle refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_an_unpicklable_env_is_reported_and_keeps_stepping(vectorization: str, caplog: pytest.LogCaptureFixture) -> None:
    if UNPICKLABLE not in gym.registry:
        gym.register(UNPICKLABLE, entry_point=UnpicklableEnv, disable_env_checker=True)
    runner = make_runner(UNPICKLABLE, vectorization=vectorization)
    try:
        runner.rollout(2)
        assert runner.get_state()["envs"] is None
        assert f"env.id={UNPICKLABLE}: its state cannot be pickled" in caplog.text and "lock" in caplog.text
        batch, _ = runner.rollout(2)  # an async worker survived the failed snapshot
        assert batch.obs_TNO[:, 0, 0].tolist() == [2.0, 0.0]
    finally:
        runner.close()


class InfoCounter(CounterEnv):
    """The counter whose steps return an info dict, as MuJoCo envs do (x_position, reward_ctrl, ...)."""

    def step(self, action: int) -> tuple:
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, {"x_position": float(self.t)}


def test_runner_copies_return_no_step_info_but_the_vector_env_keeps_the_final_observation() -> None:
    """`SnapshotEnv` drops each copy's step info (the vector env would merge it into arrays every step, unread);
    the SAME_STEP vector env still adds ``final_obs``, which truncation bootstrapping reads."""
    from gymnasium.vector import AutoresetMode

    from toolbox.envs.env_runner import SnapshotEnv

    plain = SyncVectorEnv([InfoCounter, InfoCounter], autoreset_mode=AutoresetMode.SAME_STEP)
    wrapped = SyncVectorEnv([lambda: SnapshotEnv(InfoCounter())] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    for envs in (plain, wrapped):
        envs.reset(seed=0)
    infos = [[envs.step([0, 1])[4] for _ in range(3)] for envs in (plain, wrapped)]
    assert "x_position" in infos[0][0] and all("x_position" not in info for info in infos[1])
    assert [float(x[0]) for x in infos[1][2]["final_obs"]] == [3.0, 3.0]  # the episodes of 3 steps ended
