"""GPU engines against the real packages: skipped without CUDA and the package (none on the CPU machines).

Each test samples from the tiny model, then pushes modified weights through the engine's native
weight-update path and checks that greedy outputs follow the new weights, as the learner's sync would.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolbox.data.prompts import PromptSource
from toolbox.data.tasks import TASKS
from toolbox.engines import ENGINES, SamplingConfig
from toolbox.models.loading import load_causal_lm
from toolbox.rl.weights import pack_state_dict

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_generate_then_weight_update_changes_greedy_output(engine: str, tiny_model_dir: Path) -> None:
    pytest.importorskip(engine)
    path = str(tiny_model_dir)
    eng = ENGINES.build({"name": engine}, inject={"model_path": path, "dtype": "float32", "seed": 0})
    requests = PromptSource(TASKS.build({"name": "digit_add"}), eng.tokenizer, seed=0).step(0, 4, 2)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=4)
    before = eng.generate(requests, greedy)
    assert len(before) == len(requests) and before.response_mask_BR.sum() > 0
    assert torch.isfinite(before.logprobs_BR).all()
    # A zero LM head makes every logit equal: greedy decoding (argmax, first index on ties) must then
    # emit token 0 everywhere, with log-prob -log(vocab), if and only if the new weights arrived.
    model = load_causal_lm(path)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    eng.update_weights(pack_state_dict(model.state_dict()))
    after = eng.generate(requests, greedy)
    assert (after.response_ids_BR[:, 0] == 0).all()
    vocab = model.lm_head.weight.shape[0]
    assert torch.allclose(after.logprobs_BR[:, 0], torch.full((len(after),), -float(torch.log(torch.tensor(vocab)))),
                          atol=1e-3)
