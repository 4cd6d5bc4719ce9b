"""Two GRPO steps with LoRA on SmolLM2 through `toolbox.commands.run.main` on a local Ray (experiment grpo_smollm2_arith,
shrunk): both steps run with a finite loss, and the final checkpoint holds SmolLM2's base weights bit for bit beside
adapters that trained (peft starts every B at zero), which the run's export wrote as its adapter.

The reward is a stand-in that scores the parity of the response's length: about half of any group's samples differ
from the others, so the step has advantages to train on whatever the model answers (SmolLM2-135M rarely gets the
arithmetic right in 8 tokens, which would leave every advantage 0 and the adapters where they started).

Not covered: the experiment's own reward and lengths (its settings are tuned elsewhere), merged weight sync's
numbers (tests/unit/test_lora.py on the tiny model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from toolbox.commands import run as toolbox_run
from toolbox.learner.checkpoint import load_model_weights
from toolbox.learner.hf_export import base_model
from toolbox.learner.lora import PEFT_PREFIX, LoraConfig, add_adapters

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LORA = LoraConfig(r=8, alpha=16.0)


def test_two_lora_grpo_steps_train_the_adapters_and_leave_the_base_weights(ray_session: None, smollm2_dir: Path,
                                                                            tmp_path: Path) -> None:
    # One torch thread per actor: the two share the cores with the test process. A constant learning rate: the
    # experiment's warmup starts at 0, which would leave step 1's update out. No final evaluation (10 s of SmolLM2
    # sampling the eval set, which nothing here reads).
    argv = ["experiment=grpo_smollm2_arith", f"model.path={smollm2_dir}", "model.tiny=null",
            f"trainer.run_root={tmp_path}", "trainer.total_steps=2", "trainer.eval_every=0", "trainer.final_eval=false",
            "trainer.export=true", "trainer.log_samples_every=0", "callbacks=[{name: jsonl}]", "algorithm.prompts_per_step=2",
            "algorithm.group_size=4", "rollout.num_workers=1", "rollout.torch_threads=1", "rollout.sampling.max_new_tokens=8",
            "learner.num_workers=1", "learner.strategy=single", "learner.torch_threads=1", "learner.micro_batch_size=8",
            "learner.optim={lr: 1.0e-3, scheduler: constant}", "reward.num_workers=0",
            "reward.spec={name: format, pattern: '(?s)(..)*'}", f"learner.lora={{r: {LORA.r}, alpha: {LORA.alpha}}}"]
    assert toolbox_run.main(argv) == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r["metrics"] for r in records if r["event"] == "step_end"}
    assert sorted(steps) == [1, 2]
    assert all(math.isfinite(m["loss"]) for m in steps.values()), {s: m["loss"] for s, m in steps.items()}
    assert max(m["adv_abs"] for m in steps.values()) > 0, "no group had rewards to learn from"

    # The final checkpoint, loaded into the same adapter model on one process.
    model = add_adapters(base_model(str(smollm2_dir)), LORA)
    load_model_weights(run_dir / "checkpoints" / "step_2", model)
    trained = model.state_dict()
    base = base_model(str(smollm2_dir)).state_dict()
    frozen = {k: v for k, v in trained.items() if "lora_" not in k}
    assert len(frozen) == len(base)
    changed = [k for k, v in frozen.items() if not torch.equal(v, base[k.removeprefix(PEFT_PREFIX).replace(
        ".base_layer.", ".")])]
    assert changed == [], f"LoRA changed base weights: {changed[:5]}"
    lora_b = {k: v for k, v in trained.items() if ".lora_B." in k}
    assert len(lora_b) == 7 * 30, "adapters on every linear layer of the 30 blocks but the output head"
    assert all(v.abs().sum() > 0 for v in lora_b.values()), "an adapter's B is still at its zero start"

    # trainer.export wrote the final adapter (peft's names, the adapter name dropped) and the merged model.
    adapter = load_file(run_dir / "hf" / "adapter" / "adapter_model.safetensors")
    assert json.loads((run_dir / "hf" / "adapter" / "adapter_config.json").read_text())["r"] == LORA.r
    for key, value in lora_b.items():
        assert torch.equal(adapter[key.replace(".default.", ".")], value), key
    assert (run_dir / "hf" / "model.safetensors").is_file()
