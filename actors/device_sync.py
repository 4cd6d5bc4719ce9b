"""The driver's side of the NCCL weight sync (`toolbox.engines.nccl_sync`): open the group, then mark the role groups
so that each step's export is learner rank 0's send and the engines' weight load is the matching receive.

NCCL collectives need every rank inside them at once, so the driver never lets one side wait for the other: the
learner's and the engines' calls are submitted together and waited on together. (Ray runs each actor's calls in
order, so a receive queued behind a ``generate`` starts when that generate is done and then waits inside NCCL for
the learner's send, which is queued behind the learner's update; the send's deadline is therefore a rollout call's
plus a learner call's.)
"""

from __future__ import annotations

import logging

from toolbox.core.pending import wait
from toolbox.engines.nccl_sync import Wire, plan_group

from .calls import Args
from .learner import LearnerWorker
from .roles import LearnerGroupBase, RolloutGroup
from .rollout import RolloutWorker

log = logging.getLogger(__name__)


def open_nccl_sync(learner: object, engines: object, buffer_bytes: int, wire: Wire = "vllm", dtype: str = "") -> None:
    """Learner rank 0 and every engine worker join one NCCL group (rank 0 hosts the rendezvous on a free port of its
    node); the engines learn the weight manifest. Afterwards ``learner.export_weights()`` sends and
    ``engines.update_weights(...)`` receives (`LearnerGroupBase.device_sync`, `RolloutGroup.device_sync`).
    ``learner`` / ``engines``: the role groups of `toolbox.actors.roles` (the trainers see them as Protocols);
    ``wire``: the engines' receiver (``vllm`` or ``sglang``, the ``rollout.engine.name``); ``dtype``: the engines'
    (``rollout.dtype``), which learner rank 0 casts floating-point weights to before sending."""
    if not isinstance(learner, LearnerGroupBase) or not isinstance(engines, RolloutGroup):
        raise TypeError(f"nccl weight sync: needs the learner and rollout role groups of toolbox.actors.roles, got "
                        f"{type(learner).__name__} and {type(engines).__name__}")
    address, port = learner.group.call(LearnerWorker.rendezvous, [Args()], ranks=[0])[0]
    workers = engines.group.each(RolloutWorker.sync_workers).result()
    init, offsets = plan_group(address, port, workers, buffer_bytes, wire, dtype)
    manifest = learner.group.call(LearnerWorker.weight_manifest, [Args(dtype)], ranks=[0])[0]
    # Both sides in flight before either is waited on: the rendezvous returns only when all world_size ranks joined.
    joining = engines.group.submit(RolloutWorker.open_weight_sync, [Args(init.worker_info(o), manifest) for o in offsets])
    wait(learner.group.each(LearnerWorker.open_weight_sync, init), joining)
    learner.device_sync = engines.device_sync = True
    # The send waits inside NCCL until every engine's receive runs, which Ray queues behind the engine's generate
    # (sampling the next step while the learner trains): its deadline spans one rollout call and one learner call.
    learner.sync_timeout_s = engines.group.timeout_s + learner.group.timeout_s
    log.info("weight sync: NCCL group of %d ranks open at %s:%d (learner rank 0 + %s %s engine workers), %d tensors, "
             "%.1f MB per round in chunks of %d MB", init.world_size, address, port, workers, wire, len(manifest),
             sum(s.nbytes for s in manifest) / 2**20, buffer_bytes >> 20)
