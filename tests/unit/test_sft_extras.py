"""The seeds' remaining SFT pieces: label smoothing (against torch's cross_entropy), next-token pretraining on raw
``{"text"}`` documents packed without attention crossing a document boundary, and the mixture-of-experts router
auxiliary loss on a tiny Qwen2MoE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from toolbox.algorithms.sft.config import SFTConfig
from toolbox.algorithms.sft.learner import SFTLearner
from toolbox.data.offline import load_records
from toolbox.learner.config import LearnerConfig
from toolbox.objectives.supervised import masked_nll, token_nll

TASK = {"name": "digit_add", "max_operand": 9}
DOCS = ["12+34=46", "7+8=15+1=16", "1234567890" * 3, "5+5=10"]  # the third is longer than max_length=16


def make_learner(model_dir: Path, micro: int = 8, **algo: object) -> SFTLearner:
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=micro)
    return SFTLearner(str(model_dir), "float32", cfg, SFTConfig(batch_size=4, max_length=16, **algo), total_steps=2,
                      task=TASK, seed=0)


def test_label_smoothing_matches_torch_cross_entropy() -> None:
    gen = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(2, 5, 11, generator=gen), torch.randint(0, 11, (2, 5), generator=gen)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 3:] = False
    for eps in (0.0, 0.1, 0.3):
        want = F.cross_entropy(logits[mask], labels[mask], label_smoothing=eps)
        torch.testing.assert_close(masked_nll(logits, labels, mask, label_smoothing=eps), want)
    assert not torch.allclose(token_nll(logits, labels, 0.1), token_nll(logits, labels))


def test_text_documents_read_from_jsonl_and_txt(tmp_path: Path) -> None:
    jsonl, txt = tmp_path / "docs.jsonl", tmp_path / "docs.txt"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    txt.write_text("\n\n".join(DOCS) + "\n")
    assert load_records(jsonl, "sft") == load_records(txt, "sft") == [{"text": d} for d in DOCS]


def test_packed_text_documents_never_attend_across_boundaries(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    learner = make_learner(tiny_model_dir, dataset=str(data))
    batch = learner.collate([{"text": d} for d in DOCS])
    tok = learner.tokenizer
    docs = [tok(d, add_special_tokens=True)["input_ids"] + [tok.eos_token_id] for d in DOCS]
    pieces = [d for d in docs if len(d) <= 16] + [docs[2][i : i + 16] for i in range(0, len(docs[2]), 16)]
    assert batch.packed and batch.documents() == len(pieces)  # the long document is split, nothing is cut
    assert int((batch.doc_ids_BT > 0).sum()) == sum(map(len, pieces)) == int(batch.loss_mask_BT.sum())
    model = learner.policy.model.eval()
    with torch.no_grad():
        packed = model(**batch.model_inputs()).logits
        for r, row in enumerate(batch.doc_ids_BT):
            for d in row.unique().tolist():
                if d == 0:
                    continue
                at = (row == d).nonzero().squeeze(1)
                assert batch.position_ids_BT[r, at].tolist() == list(range(len(at)))  # positions restart
                alone = model(input_ids=batch.input_ids_BT[r, at].unsqueeze(0)).logits[0]
                torch.testing.assert_close(packed[r, at], alone, rtol=1e-4, atol=1e-4)
    metrics = learner.accumulate(learner.train_data.step(0, 4), backward=True)
    assert metrics["documents"] >= 4 and metrics["loss"] > 0


def test_moe_router_loss_is_added_and_reported(tiny_moe_dir: Path) -> None:
    plain, moe = make_learner(tiny_moe_dir, micro=2), make_learner(tiny_moe_dir, micro=2, moe_aux_loss_coef=0.5)
    records = plain.train_data.step(0, 4)
    base, with_aux = plain.accumulate(records, backward=False), moe.accumulate(records, backward=False)
    assert "moe_aux_loss" not in base and with_aux["moe_aux_loss"] > 0
    # loss = NLL + coef * mean router loss over the forwards
    assert with_aux["loss"] == pytest.approx(base["loss"] + 0.5 * with_aux["moe_aux_loss"], rel=1e-5)
    moe.accumulate(records, backward=True)
    gates = [p.grad for n, p in moe.policy.model.named_parameters() if n.endswith("mlp.gate.weight")]
    assert gates and all(g is not None and g.abs().sum() > 0 for g in gates)


def test_moe_coef_on_a_dense_model_is_an_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"algorithm.moe_aux_loss_coef=0.01: LeanLlama is not a "
                                         r"mixture-of-experts model"):
        make_learner(tiny_model_dir, moe_aux_loss_coef=0.01)
