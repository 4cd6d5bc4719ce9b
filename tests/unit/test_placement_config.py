"""Per-role placement (``ray.placement.<role>``) and the shared run directory check for multi-node clusters."""

from __future__ import annotations

import pytest

from toolbox.config import load_config
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
    check_run_root_shared(load_config([]), nodes=1)
    check_run_root_shared(load_config(["trainer.shared_fs=true"]), nodes=3)
    with pytest.raises(ConfigError, match=r"^trainer.run_root='/data/runs' is a local path and the Ray cluster has 3 "
                                          r"nodes: .*pass trainer.shared_fs=true, or use a remote run_root"):
        check_run_root_shared(load_config(["trainer.run_root=/data/runs"]), nodes=3)


REMOTE = ["trainer.run_root=memory://runs", "trainer.staging_root=/scratch"]
HUB = ["model.tiny=null", "model.path=HuggingFaceTB/SmolLM2-135M-Instruct"]


def test_a_remote_run_root_on_several_nodes_needs_no_shared_disk() -> None:
    """Checkpoints and exports go straight to the store; only what the driver builds on its own disk for the
    workers, or what they would write beside the staged run, still needs staging_root shared."""
    check_run_root_shared(load_config([*REMOTE, *HUB]), nodes=3)
    check_run_root_shared(load_config([*REMOTE, *HUB, "trainer.resume_from=memory://runs/a"]), nodes=3)
    check_run_root_shared(load_config([*REMOTE, "trainer.shared_fs=true"]), nodes=3)  # a tiny model, shared


@pytest.mark.parametrize(("overrides", "message"), [
    ([], r"^model.tiny: the Ray cluster has 2 nodes and the tiny model is built on the driver's disk, .*"
         r"trainer.staging_root='/scratch' is not shared\). Put staging_root on a filesystem every node mounts .*"
         r"or pass a model every node can load"),
    ([*HUB, "trainer.profile_steps=[1]"], r"^trainer.profile_steps: the Ray cluster has 2 nodes and each learner "
                                          r"rank writes its trace into its own staging directory"),
    ([*HUB, "trainer.resume_from=/data/runs/a"], r"^trainer.resume_from: .* the checkpoint is on the driver's disk"),
])
def test_a_remote_run_root_on_several_nodes_refuses_what_lives_on_the_drivers_disk(overrides: list[str],
                                                                                   message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_run_root_shared(load_config([*REMOTE, *overrides]), nodes=2)
