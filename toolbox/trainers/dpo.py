"""The offline DPO driver: one preference optimizer step per train_step (see `OfflineTrainer`)."""

from __future__ import annotations

from toolbox.trainers import TRAINERS
from toolbox.trainers.offline import OfflineTrainer


@TRAINERS.register("dpo")
class DPOTrainer(OfflineTrainer):
    """Offline DPO / IPO / hinge; the summary tracks loss, preference accuracy and reward margin."""

    summary_metrics = ("loss", "accuracy", "margin")
