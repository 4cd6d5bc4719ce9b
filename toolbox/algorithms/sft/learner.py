"""`SFTLearner`: supervised fine-tuning on one rank — masked next-token loss, optional packing, and a
mixture-of-experts model's router loss (`toolbox.learner.router.RouterLoss`).

The loss (``algorithm.loss``: `toolbox.objectives.registry.SUPERVISED_LOSSES`) of every micro-batch is divided by
the *global* count of what the loss averages over (target tokens for ``sft``, documents for ``seq``) of the step, so
micro-batch accumulation and data parallelism both reproduce the gradient of one big batch. Packed rows differ in
number between ranks, so every rank runs as many micro-batches as the busiest one
(the extra ones are empty): FSDP's collectives must line up.
"""

from __future__ import annotations

from typing import Any

import torch

from toolbox.algorithms.sft.config import SFTConfig
from toolbox.data.encode import Example, encode_sft, encode_text
from toolbox.data.offline import Record
from toolbox.data.packing import TokenBatch, check_packing, pack_examples, pad_examples, text_chunks
from toolbox.learner.collective import global_max, global_sum
from toolbox.learner.config import LearnerConfig
from toolbox.learner.offline import OfflineLearner
from toolbox.learner.rows import chunks_of
from toolbox.objectives.registry import SUPERVISED_LOSSES
from toolbox.objectives.supervised import document_count, shift_targets


class SFTLearner(OfflineLearner):
    """One SFT learner rank."""

    kind = "sft"

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: SFTConfig, total_steps: int,
                 task: dict[str, Any], seed: int = 0) -> None:
        super().__init__(model_path, dtype, cfg, algo, total_steps, task, seed,
                         router_loss_coef=algo.moe_aux_loss_coef)
        self.algo = algo
        self.loss = SUPERVISED_LOSSES.build(algo.loss)
        if algo.packing:
            check_packing(self.policy.model, len(self.tokenizer))

    def collate(self, records: list[Record]) -> TokenBatch:
        """Tokenise (with loss masks) and pack or pad this rank's records; a raw-text document longer than
        ``max_length`` becomes several documents of ``max_length`` tokens (each with its own positions)."""
        a, pad = self.algo, self.tokenizer.pad_token_id
        examples = [chunk for r in records for chunk in
                    (text_chunks(encode_text(r["text"], self.tokenizer), a.max_length) if "text" in r
                     else [encode_sft(r, self.tokenizer, a.max_length, a.use_chat_template)])]
        return pack_examples(examples, a.max_length, pad) if a.packing else pad_examples(examples, pad)

    def accumulate(self, records: list[Record], backward: bool) -> dict[str, float]:
        batch = self.collate(records)
        _, mask_BT = shift_targets(batch.input_ids_BT, batch.loss_mask_BT, batch.doc_ids_BT)
        doc_ids_BT = batch.doc_ids_BT[:, 1:]
        tokens_all, docs_all, norm_all = global_sum([float(mask_BT.sum()), document_count(doc_ids_BT, mask_BT),
                                                     self.loss.count(mask_BT, doc_ids_BT)])
        # This rank's share of the global normaliser: gradients are averaged over ranks.
        norm = norm_all / self.world
        parts = [batch.select(rows) for rows in chunks_of(slice(0, len(batch)), self.cfg.micro_batch_size)]
        parts += [self._empty_batch(batch.packed)] * (int(global_max(len(parts))) - len(parts))
        loss = 0.0
        for part in parts:
            # Ranks run equally many parts, so the router loss / parts averages over every rank's forwards.
            value = self.policy.router.add(self._part_loss(part, norm), 1.0 / len(parts))
            if backward:
                value.backward()
            loss += float(value.detach())
        real = float((batch.doc_ids_BT > 0).sum())
        loss_all, real_all, slots_all = global_sum([loss, real, float(batch.doc_ids_BT.numel())])
        return {"loss": loss_all / self.world, "tokens": tokens_all, "documents": docs_all,
                "train_tokens": real_all, "train_seq_len": real_all / max(docs_all, 1.0),
                "fill": real_all / max(slots_all, 1.0), **self.policy.router.metrics()}

    def _part_loss(self, part: TokenBatch, norm: float) -> torch.Tensor:
        """One micro-batch's share of the supervised loss."""
        labels, mask = shift_targets(part.input_ids_BT, part.loss_mask_BT, part.doc_ids_BT)
        logits = self.policy.model(**part.model_inputs()).logits[:, :-1]
        return self.loss(logits, labels, mask, part.doc_ids_BT[:, 1:], norm)

    def _empty_batch(self, packed: bool) -> TokenBatch:
        """A one-row batch with no target token: keeps this rank's forward/backward count equal to the others'."""
        pad = self.tokenizer.pad_token_id
        empty = [Example([pad, pad], [0, 0])]
        return pack_examples(empty, 2, pad) if packed else pad_examples(empty, pad)
