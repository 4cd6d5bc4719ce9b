"""The path the learner's weights take to the rollout workers, opened once every role has started: the object store
(nothing to open), shared memory (learner rank 0 and the engines on one node) or NCCL (GPUs of their own), as
`toolbox.engines.placement.choose_sync_path` picks from the config and the nodes the actors landed on. The builder
opens it for every plan with rollout workers; an algorithm's wiring and loop never see the choice: the learner and
rollout groups' ``export_weights`` / ``update_weights`` take whichever path is open."""

from __future__ import annotations

import logging
from typing import Any

from toolbox.config.schema import ExperimentConfig
from toolbox.engines.placement import SyncPath

log = logging.getLogger(__name__)


def open_weight_sync(cfg: ExperimentConfig, nodes: dict[str, list[str | None]], learner: Any, rollout: Any) -> str:
    """Open the path ``choose_sync_path`` picks between the ``learner`` and ``rollout`` role groups (typed groups of
    `toolbox.actors.roles`); ``nodes``: each role's actors' Ray node ids. Returns the path's name."""
    from toolbox.algorithms.base import rollout_dtype

    sync = log_placement(cfg, nodes).runs
    if sync == "shared_memory":
        from toolbox.actors.shared_sync import open_shared_sync

        open_shared_sync(learner, rollout, dtype=rollout_dtype(cfg))
    elif sync == "nccl":
        from toolbox.actors.device_sync import open_nccl_sync

        open_nccl_sync(learner, rollout, cfg.learner.bucket_mb << 20,
                       wire="sglang" if cfg.rollout.engine.name == "sglang" else "vllm", dtype=rollout_dtype(cfg))
    return sync


def log_placement(cfg: ExperimentConfig, nodes: dict[str, list[str | None]]) -> SyncPath:
    """Once at start: the weight-sync path the placement calls for (from the nodes the actors landed on), and
    what a colocated learner keeps on its GPU while the engines generate. Returns that path."""
    from toolbox.engines.placement import choose_sync_path

    path = choose_sync_path(cfg, nodes.get("learner"), nodes.get("rollout"))
    log.info("%s", path.describe())
    if (cfg.rollout.placement == "colocate" and cfg.learner.gpus_per_worker and cfg.learner.offload == "none"
            and not cfg.learner.offload_while_generating):
        log.warning("rollout.placement: colocate with learner.offload: none: each learner rank keeps its shards, "
                    "gradients and AdamW state on the GPU while the engine generates; "
                    "learner.offload_while_generating: true moves them to host memory between the export and the next "
                    "update (learner.offload: params keeps them there for good)")
    return path
