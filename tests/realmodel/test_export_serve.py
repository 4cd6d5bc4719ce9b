"""SmolLM2 out of the learner and back in: `PolicyRank.export_hf` writes RUN/hf, which plain ``transformers`` reloads
with the learner's logits bit for bit (tied embeddings included) and SmolLM2's tokenizer and chat template; then
``toolbox serve RUN`` answers the ``openai`` client's chat completion with the chat-templated prompt, and at
temperature 0 with the text ``transformers``' own greedy ``generate`` gives for it.

The exported policy is the base model with small noise added, so an export of the base weights would fail. The
server runs in a thread of this process on 127.0.0.1 (as tests/integration/test_serve.py runs it).

Not covered: LoRA exports (tests/realmodel/test_grpo_lora_ray.py), the DCP checkpoint's ``toolbox export``
(the same `write_hf_dir` behind it; the LoRA run's test reads its checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from toolbox.learner.config import LearnerConfig
from toolbox.learner.policy import PolicyRank

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "system", "content": "Answer in as few words as possible."},
            {"role": "user", "content": "What is the capital of France?"}]
KEY = "sk-realmodel"


@pytest.fixture(scope="module")
def exported(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A run directory whose hf/ is the export of a policy moved off the base weights (noise of std 1e-3), and
    that policy's module."""
    policy = PolicyRank.pretrained(str(smollm2_dir), "float32", LearnerConfig(num_workers=1, strategy="single",
                                                                             device="cpu"), 1)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=generator))
    run_dir = tmp_path_factory.mktemp("run")
    assert policy.export_hf(run_dir / "hf") == str(run_dir / "hf")
    return run_dir, policy.model.eval()


@pytest.fixture(scope="module")
def reloaded(exported: tuple[Path, Any]) -> Any:
    return AutoModelForCausalLM.from_pretrained(exported[0] / "hf", dtype=torch.float32).eval()


def chat_ids(tokenizer: Any) -> list[int]:
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_reloaded_export_has_the_learners_logits_bit_for_bit(exported: tuple[Path, Any], reloaded: Any,
                                                             smollm2_tokenizer: Any, smollm2_engine: Any) -> None:
    _, policy = exported
    ids = torch.tensor([chat_ids(smollm2_tokenizer)])
    with torch.no_grad():
        mine, theirs, base = (m(input_ids=ids).logits for m in (policy, reloaded, smollm2_engine.model))
    assert torch.equal(theirs, mine), f"max abs difference {(theirs - mine).abs().max().item():.2e}"
    assert (base - mine).abs().max() > 1e-3, "the exported policy is not the base model"
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr(), "tied as SmolLM2's"
    assert reloaded.config.eos_token_id == 2 and reloaded.generation_config.eos_token_id == 2


def test_reloaded_tokenizer_encodes_the_same_ids_and_keeps_the_chat_template(exported: tuple[Path, Any],
                                                                            smollm2_tokenizer: Any) -> None:
    tok = AutoTokenizer.from_pretrained(exported[0] / "hf")
    assert tok.chat_template == smollm2_tokenizer.chat_template and "<|im_start|>" in tok.chat_template
    ids = chat_ids(tok)
    assert ids == chat_ids(smollm2_tokenizer) and ids[:3] == [1, 9690, 198]
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (2, 2, 1)


@pytest.fixture(scope="module")
def served(exported: tuple[Path, Any]) -> Iterator[tuple[str, Any]]:
    """``toolbox serve model=RUN_DIR`` as its `main` builds it, on a free loopback port, with an API key."""
    from toolbox.commands.serve import build_server, parse_args, resolve_catalog_model
    from toolbox.serving.app import create_app
    from toolbox.serving.background import free_port, serve_in_thread

    run_dir, _ = exported
    config = resolve_catalog_model(parse_args([f"model={run_dir}", "served_model_name=smollm2",
                                               f"port={free_port()}"]))
    assert config.model_dir() == str(run_dir / "hf")
    server = build_server(config)
    with serve_in_thread(create_app(server, api_key=KEY), config.port) as url:
        yield url, server


def test_chat_completion_is_the_greedy_completion_of_the_templated_prompt(served: tuple[str, Any], reloaded: Any,
                                                                          smollm2_tokenizer: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import openai

    url, server = served
    queued: list[list[int]] = []
    submit = server.batcher.submit

    def recording(sequences: list[Any]) -> None:
        queued.extend(s.prompt_ids for s in sequences)
        submit(sequences)

    monkeypatch.setattr(server.batcher, "submit", recording)
    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    out = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=16,  # type: ignore[arg-type]
                                         temperature=0.0)
    ids = chat_ids(smollm2_tokenizer)
    assert queued == [ids], "the engine is handed the ChatML rendering of the messages"
    assert smollm2_tokenizer.decode(ids).startswith("<|im_start|>system\nAnswer in as few words")
    assert out.usage is not None and out.usage.prompt_tokens == len(ids)
    with torch.no_grad():
        direct = reloaded.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   do_sample=False, max_new_tokens=16, eos_token_id=2, pad_token_id=2)
    new = direct[0, len(ids):].tolist()
    expected = smollm2_tokenizer.decode(new, skip_special_tokens=True)
    text = out.choices[0].message.content
    assert text and text == expected
    assert out.choices[0].finish_reason == ("stop" if 2 in new else "length")
    assert out.usage.completion_tokens == len(new)
