"""Models out and evaluation on a real local Ray: a run with 2 FSDP2 learner ranks exports RUN_DIR/hf (gathered
from the shards), `toolbox.commands.export` converts the 2-rank DCP checkpoint to the same logits, and `toolbox.commands.eval`
scores the export on 2 rollout workers (Ray actors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from toolbox.commands import eval as toolbox_eval
from toolbox.commands import export as toolbox_export
from toolbox.commands import run as toolbox_run

pytestmark = pytest.mark.integration

SMALL = ["algorithm.prompts_per_step=2", "algorithm.group_size=4", "learner.micro_batch_size=2", "rollout.num_workers=1",
         "reward.num_workers=1", "callbacks=[{name: jsonl}]", "trainer.eval_every=0"]


def test_two_rank_run_exports_and_evaluates_on_ray(ray_session: None, tmp_path: Path) -> None:
    argv = [*SMALL, "learner.num_workers=2", "learner.strategy=fsdp2", "trainer.total_steps=2", "trainer.export=true",
            f"trainer.run_root={tmp_path}"]
    assert toolbox_run.main(argv) == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert toolbox_export.main([str(run_dir), str(tmp_path / "from_dcp")]) == 0  # the 2-rank step_2 checkpoint

    ids = torch.tensor([[1, 5, 6, 7, 8], [2, 9, 10, 4, 3]])
    with torch.no_grad():
        gathered = AutoModelForCausalLM.from_pretrained(run_dir / "hf", dtype=torch.float32).eval()(ids).logits
        from_dcp = AutoModelForCausalLM.from_pretrained(tmp_path / "from_dcp", dtype=torch.float32).eval()(ids).logits
    torch.testing.assert_close(from_dcp, gathered, atol=1e-5, rtol=0)

    out = tmp_path / "eval"
    assert toolbox_eval.main([f"model={run_dir}", "samples=2", "prompts=4", "rollout.num_workers=2", f"out={out}"]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["model"] == str(run_dir / "hf")
    assert {"pass@1", "pass@2", "reward_mean", "response_len_mean", "reward_error"} <= report["metrics"].keys()
    assert report["metrics"]["prompts"] == 4 and report["metrics"]["reward_error"] == 0
    assert len((out / "eval_samples.jsonl").read_text().splitlines()) == 4
