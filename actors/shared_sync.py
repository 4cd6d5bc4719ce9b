"""The driver's side of the same-node shared-memory weight sync (`toolbox.rl.shared_weights`): open the pool, attach
the engines, then mark the role groups so that each step's export is learner rank 0's write into a slot and each
engine's weight load waits for that slot (`LearnerGroupBase.device_sync`, `RolloutGroup.device_sync`: both calls
in flight at once, as for NCCL; no bucket refs).

The learner's calls and the engines' are submitted together; an engine's receive, queued behind its generate,
waits for the generation the learner publishes after its update, so its deadline is a rollout call's plus a
learner call's. A learner group started anew (``learner.max_restarts``) opens a new pool and the engines attach to
it (`WorkerGroup.on_replace`).
"""

from __future__ import annotations

import logging
from typing import Any

from toolbox.rl.shared_weights import SharedPool

from .learner import LearnerWorker
from .roles import LearnerGroupBase, RolloutGroup
from .rollout import RolloutWorker

log = logging.getLogger(__name__)


def open_shared_sync(learner: object, engines: object, dtype: str = "") -> bool:
    """Open learner rank 0's pool for every engine; ``False`` (and the object store stays) when an engine cannot
    attach to it (another node, another PID namespace). ``dtype``: the engines' (``rollout.dtype``), which rank 0
    writes floating-point weights in."""
    if not isinstance(learner, LearnerGroupBase) or not isinstance(engines, RolloutGroup):
        raise TypeError(f"shared-memory weight sync: needs the learner and rollout role groups of toolbox.actors.roles, "
                        f"got {type(learner).__name__} and {type(engines).__name__}")
    timeout_s = engines.group.timeout_s + learner.group.timeout_s
    pool, refused = _open(learner, engines, dtype, timeout_s)
    if refused:
        log.warning("weight sync: shared memory chosen, but %s: falls back to the object store", refused)
        return False
    learner.device_sync = engines.device_sync = engines.shared_sync = True
    learner.sync_timeout_s = timeout_s
    replace = getattr(learner.group, "on_replace", None)
    if hasattr(learner.group, "on_replace"):  # a learner group started anew opens a new pool, the engines attach
        def reopen(group: Any) -> None:
            if replace is not None:
                replace(group)
            refused = _open(learner, engines, dtype, timeout_s)[1]
            if refused:
                raise RuntimeError(f"shared-memory weight sync: the restarted learner's pool: {refused}")
        learner.group.on_replace = reopen
    log.info("weight sync: shared memory, %d tensors, %.1f MB a slot, %d engine(s) attached", len(pool.manifest),
             pool.slot_bytes / 2**20, len(engines))
    return True


def _open(learner: LearnerGroupBase, engines: RolloutGroup, dtype: str, timeout_s: float) -> tuple[SharedPool, str]:
    """Rank 0's new pool, and why an engine could not attach to it ("" when every engine did)."""
    pool = learner.group.each(LearnerWorker.open_shared_sync, len(engines), dtype).result()[0]
    if pool is None:
        raise RuntimeError("shared-memory weight sync: learner rank 0 returned no pool")
    answers = engines.group.each(RolloutWorker.open_shared_sync, pool, timeout_s).result()
    return pool, "; ".join(f"rollout worker {rank}: {why}" for rank, why in enumerate(answers) if why)
