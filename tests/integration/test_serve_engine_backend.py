"""``toolbox serve engine=NAME`` for a non-hf engine: the engine backend driving a registered `InferenceEngine`.

A fake engine registered here (deterministic digits, log-prob ``-(k + 1) / 10`` for the k-th token, optional EOS,
a delay that lets concurrent requests pile up, and a record of every call) runs behind the real FastAPI app,
queried with the official ``openai`` client on 127.0.0.1. The last test serves the real ``hf`` engine through the
same backend and compares its greedy output with the continuous batcher's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from pydantic import BaseModel, ConfigDict  # noqa: E402
from safetensors.torch import save  # noqa: E402

from tests.integration.serve_client import ADMIN, CHAT_TEMPLATE, KEY, MODEL, http_json  # noqa: E402
from toolbox.engines.base import ENGINES, SamplingConfig  # noqa: E402
from toolbox.engines.common import Sample, batch_from_samples  # noqa: E402
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, PromptRequest, RolloutBatch  # noqa: E402
from toolbox.rl.weights import WeightBucket, unpack_all  # noqa: E402
from toolbox.serving.app import create_app  # noqa: E402
from toolbox.serving.background import free_port, serve_in_thread  # noqa: E402
from toolbox.serving.config import ServeConfig  # noqa: E402
from toolbox.serving.engine_backend import EngineServer  # noqa: E402
from toolbox.serving.server import ModelServer, ServedModel  # noqa: E402
from toolbox.serving.weights import digest_of  # noqa: E402

FAKE = "fake_serve_test"
DIGIT0, EOS = 4, 2  # the tiny char tokenizer: ids 4..13 are "0".."9", 2 is </s>


class FakeEngineConfig(BaseModel):
    """Options of the fake engine (set through ``engine_options``, as ``engine.X=V`` on the command line)."""

    model_config = ConfigDict(extra="forbid")
    eos_after: int = 0  # >0: after this many digits, EOS (when the sampling stops at EOS)
    delay_s: float = 0.0


def fake_tokens(prompt: list[int], count: int) -> list[int]:
    """The digits the fake engine answers ``prompt`` with."""
    return [DIGIT0 + (sum(prompt) + k) % 10 for k in range(count)]


class FakeEngine:
    """Deterministic `InferenceEngine`: records each ``generate`` call's size and each weight push."""

    def __init__(self, model_path: str, seed: int = 0, config: FakeEngineConfig | None = None) -> None:
        self.config = config or FakeEngineConfig()
        self.batch_sizes: list[int] = []
        self.samplings: list[SamplingConfig] = []
        self.pushed: dict[str, torch.Tensor] | None = None

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        self.batch_sizes.append(len(requests))
        self.samplings.append(sampling)
        time.sleep(self.config.delay_s)
        return batch_from_samples(requests, [self._sample(r.ids, sampling) for r in requests], pad_id=0)

    def _sample(self, prompt: list[int], sampling: SamplingConfig) -> Sample:
        eos = self.config.eos_after
        if sampling.stop_at_eos and 0 < eos < sampling.max_new_tokens:
            ids = [*fake_tokens(prompt, eos), EOS]
            return Sample(ids, [-(k + 1) / 10 for k in range(len(ids))], FINISH_STOP)
        ids = fake_tokens(prompt, sampling.max_new_tokens)
        return Sample(ids, [-(k + 1) / 10 for k in range(len(ids))], FINISH_LENGTH)

    def update_weights(self, buckets: list[WeightBucket]) -> int:
        self.pushed = {k: v.clone() for k, v in unpack_all(buckets).items()}
        return sum(b.nbytes for b in buckets)

    def state_dict(self) -> dict[str, Any]:
        if self.pushed is None:
            raise NotImplementedError("nothing pushed yet")
        return self.pushed


@pytest.fixture(scope="module", autouse=True)
def fake_engine() -> Iterator[None]:
    """The fake engine is registered for this module only: the config reference and other tests never see it."""
    ENGINES.register(FAKE, config=FakeEngineConfig)(FakeEngine)
    yield
    ENGINES.unregister(FAKE)


@contextmanager
def serving(model_server: ServedModel) -> Iterator[tuple[str, openai.OpenAI]]:
    """``model_server`` behind the real app on a free 127.0.0.1 port, and an openai client of it."""
    model_server.tokenizer.chat_template = CHAT_TEMPLATE
    port = free_port()
    with serve_in_thread(create_app(model_server, api_key=KEY, admin_token=ADMIN), port) as url:
        yield url, openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def fake_server(tiny_model_dir: Path) -> Iterator[tuple[str, openai.OpenAI, EngineServer]]:
    config = ServeConfig(model=str(tiny_model_dir), served_model_name=MODEL, engine=FAKE,
                         engine_options={"eos_after": 5, "delay_s": 0.3})
    model_server = EngineServer(config)
    with serving(model_server) as (url, client):
        yield url, client, model_server


def _engine(server: EngineServer) -> FakeEngine:
    assert isinstance(server.engine, FakeEngine)
    return server.engine


def test_completions_map_n_token_ids_logprobs_and_finish(fake_server: tuple[str, openai.OpenAI, EngineServer],
                                                        tiny_model_dir: Path) -> None:
    _, client, server = fake_server
    prompt = [5, 6, 3, 7]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, n=3, logprobs=0,
                                    extra_body={"return_token_ids": True})
    expected = fake_tokens(prompt, 4)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    for choice in out.choices:
        assert (choice.model_extra or {})["token_ids"] == expected
        assert choice.logprobs is not None and choice.logprobs.token_logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4])
        assert choice.text == server.tokenizer.decode(expected) and choice.finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 12
    assert _engine(server).samplings[-1].max_new_tokens == 4


def test_engine_eos_is_a_stop_and_ignore_eos_runs_to_max_tokens(
        fake_server: tuple[str, openai.OpenAI, EngineServer]) -> None:
    _, client, _ = fake_server
    stopped = client.completions.create(model=MODEL, prompt="12+", max_tokens=9,
                                        extra_body={"return_token_ids": True}).choices[0]
    assert stopped.finish_reason == "stop" and (stopped.model_extra or {})["token_ids"][-1] == EOS
    assert len(stopped.text) == 5  # the EOS token has no text
    full = client.completions.create(model=MODEL, prompt="12+", max_tokens=9,
                                     extra_body={"ignore_eos": True}).choices[0]
    assert full.finish_reason == "length" and len(full.text) == 9


def test_stop_strings_cut_the_text(fake_server: tuple[str, openai.OpenAI, EngineServer]) -> None:
    _, client, _ = fake_server
    base: dict[str, Any] = {"model": MODEL, "prompt": "3+4=", "max_tokens": 9, "extra_body": {"ignore_eos": True}}
    full = client.completions.create(**base).choices[0].text
    cut = client.completions.create(**base, stop=[full[3:5]]).choices[0]
    assert (cut.text, cut.finish_reason) == (full[:3], "stop")


def test_top_logprobs_are_refused(fake_server: tuple[str, openai.OpenAI, EngineServer]) -> None:
    _, client, _ = fake_server
    with pytest.raises(openai.BadRequestError, match="reports only the sampled token's log-prob"):
        client.completions.create(model=MODEL, prompt="1", max_tokens=2, logprobs=2)


def test_chat_and_streaming(fake_server: tuple[str, openai.OpenAI, EngineServer]) -> None:
    _, client, server = fake_server
    messages: list[Any] = [{"role": "user", "content": "12+34"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, logprobs=True,
                                          extra_body={"ignore_eos": True}).choices[0]
    prompt = server.chat_prompt([{"role": "user", "content": "12+34"}])
    assert chat.message.content == server.tokenizer.decode(fake_tokens(prompt, 3))
    assert chat.logprobs is not None and [e.logprob for e in chat.logprobs.content or []] == pytest.approx(
        [-0.1, -0.2, -0.3])
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": "7+8=", "max_tokens": 6, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole and chunks[-1].choices[0].finish_reason == "length"
    streamed = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, stream=True,
                                                   extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat.message.content


def test_concurrent_requests_share_generate_calls(fake_server: tuple[str, openai.OpenAI, EngineServer]) -> None:
    _, client, server = fake_server
    engine, calls_before = _engine(server), server.batcher.generate_calls
    start = threading.Barrier(8)

    def ask(i: int) -> tuple[str, str]:
        start.wait()
        out = client.completions.create(model=MODEL, prompt=f"{i}+{i}=", max_tokens=3 + i % 3,
                                        extra_body={"ignore_eos": True})
        return out.choices[0].text, server.tokenizer.decode(fake_tokens(server.encode(f"{i}+{i}="), 3 + i % 3))

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert all(text == expected for text, expected in answers), "a choice got another request's row or length"
    calls = server.batcher.generate_calls - calls_before
    assert calls < 8 and max(engine.batch_sizes[-calls:]) > 1, f"{calls} generate calls for 8 requests"


def test_weight_push_reaches_update_weights_and_digest(fake_server: tuple[str, openai.OpenAI, EngineServer]) -> None:
    url, _, server = fake_server
    root = url.removesuffix("/v1")
    status, body = http_json("GET", f"{root}/v1/toolbox/weights/digest", KEY)
    assert status == 404 and body["error"]["code"] == "digest_unsupported"
    state = {"a.weight": torch.arange(6.0).reshape(2, 3), "b.bias": torch.ones(4, dtype=torch.bfloat16)}
    assert http_json("POST", f"{root}/v1/toolbox/weights", ADMIN, save(state)) == (200, {"loaded": 2, "version": 1})
    pushed = _engine(server).pushed
    assert pushed is not None and pushed.keys() == state.keys()
    assert all(torch.equal(pushed[k], v) for k, v in state.items())
    assert http_json("GET", f"{root}/v1/toolbox/weights/digest", KEY) == (200, {"sha256": digest_of(state), "version": 1})
    assert http_json("POST", f"{root}/v1/toolbox/weights", ADMIN, b"not safetensors")[0] == 400


def test_hf_engine_through_the_engine_backend_matches_the_continuous_batcher(tiny_model_dir: Path) -> None:
    config = ServeConfig(model=str(tiny_model_dir), served_model_name=MODEL)
    greedy: dict[str, Any] = {"model": MODEL, "prompt": "12+34=", "max_tokens": 10, "temperature": 0.0, "logprobs": 0,
                              "extra_body": {"ignore_eos": True, "return_token_ids": True}}
    answers = []
    for model_server in (EngineServer(config), ModelServer(config)):
        with serving(model_server) as (_, client):
            answers.append(client.completions.create(**greedy).choices[0])
    via_engine, via_batcher = answers
    assert via_engine.text == via_batcher.text and via_engine.finish_reason == via_batcher.finish_reason == "length"
    assert (via_engine.model_extra or {})["token_ids"] == (via_batcher.model_extra or {})["token_ids"]
    assert via_engine.logprobs is not None and via_batcher.logprobs is not None
    torch.testing.assert_close(torch.tensor(via_engine.logprobs.token_logprobs),
                               torch.tensor(via_batcher.logprobs.token_logprobs), atol=1e-4, rtol=0)
