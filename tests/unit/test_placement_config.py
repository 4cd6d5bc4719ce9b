"""Per-role placement (``ray.placement.<role>``) and the shared run directory check for multi-node clusters."""

from __future__ import annotations

import pytest

from toolbox.config import load_config
from toolbox.config.trainer import TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.driver.placement import trial_bundles
from toolbox.driver.preflight import check_run_root_shared


def test_custom_resources_of_a_role_go_into_its_bundles() -> None:
    cfg = load_config(["experiment=grpo_tiny_fsdp2", "rollout.num_workers=2", "reward.num_workers=1",
                       "ray.placement.rollout.resources.node_b=1",
                       "ray.placement.learner.strategy=SPREAD"])
    assert trial_bundles(cfg) == [{"CPU": 0.01}, {"CPU": 0.25, "node_b": 1.0}, {"CPU": 0.25, "node_b": 1.0},
                                  {"CPU": 0.1}, {"CPU": 0.5}, {"CPU": 0.5}]
    assert cfg.ray.placement["learner"].strategy == "SPREAD"


@pytest.mark.parametrize(("override", "message"), [
    ("ray.placement.critic.strategy=SPREAD", "ray.placement.critic: algorithm 'grpo' has the roles ['rollout', 'reward', 'learner']"),
    ("ray.placement.rollout.resources.CPU=2", "ray.placement.rollout.resources: set CPUs and GPUs with rollout.cpus_per_worker"),
    ("ray.placement.rollout.strategy=spread", "ray.placement.rollout.strategy"),
])
def test_a_bad_placement_names_its_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config([override])


def test_a_local_run_root_on_several_nodes_needs_shared_fs() -> None:
    check_run_root_shared(TrainerConfig(), nodes=1)
    check_run_root_shared(TrainerConfig(shared_fs=True), nodes=3)
    with pytest.raises(ConfigError, match=r"the Ray cluster has 3 nodes.*pass trainer.shared_fs=true"):
        check_run_root_shared(TrainerConfig(run_root="/data/runs"), nodes=3)


def test_a_remote_run_root_on_several_nodes_needs_a_shared_staging_root() -> None:
    check_run_root_shared(TrainerConfig(run_root="memory://runs", staging_root="/nfs/staging", shared_fs=True), nodes=3)
    with pytest.raises(ConfigError, match=r"^trainer.run_root='memory://runs' is remote, but the run is staged in "
                                          r"trainer.staging_root='/scratch' first and the Ray cluster has 2 nodes: .*"
                                          r"Point staging_root at a filesystem every node mounts"):
        check_run_root_shared(TrainerConfig(run_root="memory://runs", staging_root="/scratch"), nodes=2)
