"""The SFT driver: one supervised optimizer step per train_step (see `OfflineTrainer`)."""

from __future__ import annotations

from toolbox.trainers import TRAINERS
from toolbox.trainers.offline import OfflineTrainer


@TRAINERS.register("sft")
class SFTTrainer(OfflineTrainer):
    """Supervised fine-tuning; the summary tracks the loss."""

    summary_metrics = ("loss",)
