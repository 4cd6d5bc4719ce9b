"""`OfflineLearner`: the shared shape of learners that train on a fixed dataset (SFT, offline DPO).

Each rank builds its own slice of a step's global batch from the dataset spec and
the step index (`RecordSource`), so the driver sends an integer and gets metrics
back. Subclasses write ``accumulate``: forward/backward over this rank's records,
returning metrics already reduced over all ranks (every rank returns the same dict).
The model, reference, optimizer and checkpoints are the rank's `PolicyRank` (``self.policy``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from toolbox.data.encode import check_fits
from toolbox.data.offline import Kind, OfflineDataConfig, Record, RecordSource
from toolbox.data.tasks import TASKS
from toolbox.learner.collective import rank, world
from toolbox.learner.config import LearnerConfig
from toolbox.learner.policy import PolicyRank
from toolbox.learner.rows import rank_slice
from toolbox.models.loading import load_causal_lm, load_tokenizer


class OfflineLearner:
    """A learner rank over an offline dataset. ``update(step)`` and ``evaluate()`` are collective."""

    kind: Kind = "sft"
    # How a rank loads its model from ``model_path`` (path, dtype): a causal LM, or a reward model (``rm``).
    load_model: Callable[[str, str], Any] = staticmethod(load_causal_lm)

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: OfflineDataConfig, total_steps: int,
                 task: dict[str, Any], seed: int, frozen_reference: bool = False, router_loss_coef: float = 0.0) -> None:
        self.cfg, self.data_cfg = cfg, algo
        self.policy = PolicyRank.pretrained(model_path, dtype, cfg, total_steps, frozen_reference=frozen_reference,
                                            loader=type(self).load_model, router_loss_coef=router_loss_coef)
        self.rank, self.world = rank(), world()
        self.tokenizer = load_tokenizer(model_path)
        built = TASKS.build(task, inject={"data": algo.data})
        # A file record whose prompt fills max_length is a bad row (file:row), found here where the tokenizer is.
        fits = partial(check_fits, kind=self.kind, tokenizer=self.tokenizer, max_length=algo.max_length,
                       use_chat_template=algo.use_chat_template)
        self.train_data = RecordSource.train(algo, self.kind, seed, built, fits)
        self.eval_data = RecordSource.held_out(algo, self.kind, seed, built, fits)

    def update(self, step: int) -> dict[str, float]:
        """One optimizer step on this rank's share of step ``step``'s global batch; returns global metrics."""
        records = self.train_data.step(step, self.data_cfg.batch_size)
        mine = records[rank_slice(len(records), self.rank, self.world)]
        metrics = self.accumulate(mine, backward=True)
        metrics.update(self.policy.optimizer_step())
        self.policy.step += 1
        return metrics

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The same metrics on the held-out records, without updating; ``{}`` when there are none."""
        if self.eval_data is None:
            return {}
        records = self.eval_data.first(self.data_cfg.eval_samples)
        records = records[: len(records) - len(records) % self.world]  # equal shares keep collectives in step
        self.policy.model.eval()
        try:
            return self.accumulate(records[rank_slice(len(records), self.rank, self.world)], backward=False)
        finally:
            self.policy.model.train()

    @abstractmethod
    def accumulate(self, records: list[Record], backward: bool) -> dict[str, float]:
        """Loss (and, with ``backward``, gradients) of this rank's ``records``, normalised by global counts; with
        ``train_tokens`` (tokens through the model, all ranks) and ``train_seq_len`` (their mean sequence length),
        the counts of the step's throughput and MFU (`toolbox.learner.throughput`)."""
