"""`EnvConfig`: the `env` section of a classic-RL experiment: which env, how many copies, how many runners.

Only pydantic here (no gymnasium import), so composing `ExperimentConfig` stays cheap;
`toolbox.envs.make` checks the id and its spaces.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class EnvConfig(BaseModel):
    """The gymnasium id and its options, the copies each runner steps, and the env-runner actors themselves.

    Env runners are a role of their own (``env``): they are sized here, not by the
    ``rollout`` section, which configures LLM generation workers.
    """

    model_config = ConfigDict(extra="forbid")
    id: str = Field("CartPole-v1", description="A registered gymnasium id, e.g. CartPole-v1, Pendulum-v1, Acrobot-v1.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for gymnasium.make (e.g. max_episode_steps).")
    num_envs: int = Field(4, ge=1, description="Copies of the env in each runner's gymnasium.vector env.")
    vectorization: Literal["sync", "async"] = Field(
        "sync", description="How a runner steps its num_envs copies: 'sync', one after another in the runner's process "
        "(gymnasium SyncVectorEnv; best for envs that step in microseconds, e.g. classic control); 'async', each in a "
        "subprocess of its own (AsyncVectorEnv; pays off when one env step costs more than the pipe round trip, "
        "~0.1 ms, e.g. MuJoCo or Box2D with spare cores).")
    num_workers: int = Field(1, ge=1, description="Env-runner actors; each steps its own num_envs copies.")
    cpus_per_worker: float = Field(0.25, gt=0, description="Ray CPUs reserved per env runner.")
    timeout_s: float = Field(300.0, gt=0, description="Longest a rollout or evaluation call of an env runner may take before the run fails.")
