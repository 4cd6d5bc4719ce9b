"""toolbox-raft: an example plugin adding the algorithm ``raft`` (best-of-n rejection-sampling fine-tuning).

Each step samples ``group_size`` completions per prompt on the rollout workers, scores them on
the reward workers, and takes one supervised step on the best completion of every group whose
reward is at least ``min_reward``. Importing this module registers the algorithm; toolbox
imports it through the ``toolbox.plugins`` entry point (see pyproject.toml), so
``algorithm.name=raft`` works without any edit to toolbox. A walk-through is in
docs/adding-an-algorithm.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.algorithms import AlgorithmPlan, register_algorithm

from toolbox_raft.config import RaftConfig

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder

__all__ = ["RaftConfig", "wire"]


@register_algorithm("raft", RaftConfig)
def wire(builder: ExperimentBuilder) -> AlgorithmPlan:
    """Rollout workers, reward workers and RAFT learner ranks, driven by `RaftTrainer`."""
    # Ray and torch-heavy imports stay inside the wiring: importing the plugin (which every
    # registry lookup does) must stay cheap and must not need Ray.
    from toolbox.algorithms.base import PolicyRoles, policy_plan
    from toolbox.core.events import EventBus

    from toolbox_raft.learner import RaftLearner
    from toolbox_raft.loop import RaftTrainer

    c, algo = builder.cfg, builder.algorithm(RaftConfig)

    def loop(roles: PolicyRoles, bus: EventBus) -> RaftTrainer:
        return RaftTrainer(builder.trainer_config(), bus, algo, c.rollout.sampling, roles.prompts, roles.rollout,
                           roles.reward, roles.learner, builder.run_dir, c.experiment)

    # The learner is built inside each rank's actor, after its process group exists: pass the class. The plan
    # starts nothing: the builder starts the groups, opens the weight sync and then calls `loop`.
    return policy_plan(builder, RaftLearner, algo, loop)
