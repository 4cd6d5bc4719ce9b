"""Sizes and places a run's actors from its config: workers and resources per role, the bundles of a Tune trial's
placement group, and the shared placement group of a colocated run. The dry run and `toolbox deploy` read the same
functions, so what they print is what the run reserves."""

from __future__ import annotations

from typing import Any

from toolbox.config.schema import ExperimentConfig, RolePlacement
from toolbox.core.errors import ConfigError


def role_size(cfg: ExperimentConfig, role: str) -> tuple[int, float, float]:
    """(workers, CPUs each, GPUs each) of a role, from its config section (rollout, reward or learner)."""
    section = getattr(cfg, role)
    return section.num_workers, section.cpus_per_worker, getattr(section, "gpus_per_worker", 0.0)


def trial_bundles(cfg: ExperimentConfig, driver_cpus: float = 0.01) -> list[dict[str, float]]:
    """Placement-group bundles for one whole experiment: the driver's, then every role's workers."""
    return [{"CPU": driver_cpus}, *(bundle for _, bundle in role_bundles(cfg))]


def role_bundles(cfg: ExperimentConfig) -> list[tuple[str, dict[str, float]]]:
    """(role, Ray resources) of every actor of a run, in the order of the roles: CPUs, GPUs and the role's
    custom resources (``ray.placement.<role>.resources``)."""
    out = []
    for role in cfg.algorithm.roles:
        n, cpus, gpus = role_size(cfg, role)
        custom = cfg.ray.placement.get(role, RolePlacement()).resources
        out += [(role, {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **custom})] * n
    return out


def reserve_colocated(cfg: ExperimentConfig) -> Any:
    """The shared placement group of a colocated run: ``learner.num_workers`` bundles of `colocated_bundle`
    (bundle i: learner rank i and rollout worker i), scheduled within ``ray.placement_timeout_s``."""
    import ray

    from toolbox.actors.group import reserve
    from toolbox.engines.placement import colocated_bundle

    bundle, strategy = colocated_bundle(cfg)
    n, timeout = cfg.learner.num_workers, cfg.ray.placement_timeout_s
    return reserve(bundle, n, strategy, timeout, lambda: ConfigError(
        f"rollout.placement: colocate: a placement group of {n} x {bundle} (learner rank + rollout worker per "
        f"bundle) was not scheduled within {timeout:g}s (ray.placement_timeout_s); free now: "
        f"{ {k: ray.available_resources().get(k, 0.0) for k in bundle} }. Lower learner/rollout cpus_per_worker "
        "or gpus_per_worker, or add nodes"))
