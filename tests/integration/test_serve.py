"""``toolbox serve`` against the official ``openai`` client, on 127.0.0.1 with the tiny model.

No Ray: the server runs in a background thread of the test process (uvicorn on a free loopback port).
"""

from __future__ import annotations

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

from safetensors.torch import save  # noqa: E402

from tests.integration.serve_client import ADMIN, CHAT_TEMPLATE, KEY, MODEL, http_json  # noqa: E402
from toolbox.models.loading import load_causal_lm  # noqa: E402
from toolbox.models.logprobs import token_logprobs  # noqa: E402
from toolbox.serving.app import create_app  # noqa: E402
from toolbox.serving.background import free_port, serve_in_thread  # noqa: E402
from toolbox.serving.config import ServeConfig  # noqa: E402
from toolbox.serving.server import ModelServer  # noqa: E402


@contextmanager
def serving(model_dir: Path, **options: Any) -> Iterator[tuple[str, ModelServer]]:
    """A server of ``model_dir`` on a free 127.0.0.1 port, with API key KEY and admin token ADMIN."""
    config = ServeConfig(model=str(model_dir), served_model_name=MODEL, port=free_port(), **options)
    model_server = ModelServer(config)
    model_server.tokenizer.chat_template = CHAT_TEMPLATE
    app = create_app(model_server, api_key=KEY, admin_token=ADMIN)
    with serve_in_thread(app, config.port) as url:
        yield url, model_server


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[str, ModelServer]]:
    with serving(tiny_model_dir, max_batch_size=32) as out:
        yield out


@pytest.fixture(scope="module")
def client(served: tuple[str, ModelServer]) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[0], api_key=KEY, max_retries=0)


def test_models_lists_the_served_id(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_logprobs_are_the_learners_log_softmax_at_temperature(client: openai.OpenAI, tiny_model_dir: Path) -> None:
    prompt = [5, 6, 3, 7, 8, 14]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0.7, logprobs=2, seed=3,
                                    extra_body={"return_token_ids": True, "ignore_eos": True})
    choice = out.choices[0]
    ids = (choice.model_extra or {})["token_ids"]
    assert len(ids) == 12 and choice.finish_reason == "length"
    model = load_causal_lm(str(tiny_model_dir)).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits
    expected = token_logprobs(logits[:, len(prompt) - 1 : -1], torch.tensor([ids]), 0.7)[0]
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    torch.testing.assert_close(torch.tensor(choice.logprobs.token_logprobs), expected, atol=1e-5, rtol=0)
    assert choice.logprobs.top_logprobs is not None and all(len(t) == 2 for t in choice.logprobs.top_logprobs)


def test_n_samples_and_seed(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": "12+34=", "max_tokens": 10, "n": 3, "seed": 7,
                              "extra_body": {"ignore_eos": True}}
    first, again = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices}) > 1, "the n choices of one request share a sampler"
    assert first.usage is not None and first.usage.completion_tokens == 30


def test_stop_sequence_cuts_the_text(client: openai.OpenAI) -> None:
    base: dict[str, Any] = {"model": MODEL, "prompt": "12+34=", "max_tokens": 20, "temperature": 0.0,
                            "extra_body": {"ignore_eos": True}}
    full = client.completions.create(**base).choices[0].text
    stop = full[4:6]
    cut = client.completions.create(**base, stop=[stop]).choices[0]
    assert cut.text == full[: full.find(stop)] and cut.finish_reason == "stop"


def test_streaming_matches_the_whole_response(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": "7+8=", "max_tokens": 15, "seed": 11,
                              "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert len(chunks) > 1 and "".join(c.choices[0].text for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_applies_the_template(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "12+34"}], max_tokens=8,
                                         logprobs=True, top_logprobs=1, extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert isinstance(choice.message.content, str) and choice.message.role == "assistant"
    assert choice.logprobs is not None and len(choice.logprobs.content or []) == 8
    streamed = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "1"}], max_tokens=4,
                                              stream=True)
    assert [c.choices[0].finish_reason for c in streamed][-1] in {"stop", "length"}


def test_wrong_key_is_401(served: tuple[str, ModelServer]) -> None:
    bad = openai.OpenAI(base_url=served[0], api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="a wrong API key"):
        bad.completions.create(model=MODEL, prompt="1", max_tokens=1)


def test_bad_requests_get_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError, match="temperature"):
        client.completions.create(model=MODEL, prompt="1", max_tokens=1, temperature="hot")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match=r"n must be in \[1, 64\], got 0") as bad:
        client.completions.create(model=MODEL, prompt="1", max_tokens=1, n=0)
    assert bad.value.body == {"message": "n must be in [1, 64], got 0", "type": "invalid_request_error",
                              "param": "n", "code": None}
    with pytest.raises(openai.BadRequestError, match="max_tokens must be in"):
        client.completions.create(model=MODEL, prompt="1", max_tokens=10_000)
    with pytest.raises(openai.NotFoundError, match="'other' does not exist"):
        client.completions.create(model="other", prompt="1", max_tokens=1)


def test_unknown_route_is_404_in_openai_shape(served: tuple[str, ModelServer]) -> None:
    status, body = http_json("GET", served[0] + "/nothing", KEY)
    assert status == 404 and body["error"]["message"] == "no route GET /v1/nothing"


def test_full_queue_is_429(tiny_model_dir: Path) -> None:
    with serving(tiny_model_dir, max_queue=2) as (url, _):
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        with pytest.raises(openai.RateLimitError, match="max_queue=2"):
            client.completions.create(model=MODEL, prompt="1", max_tokens=1, n=3)


def test_32_concurrent_requests_are_answered_in_one_batch(client: openai.OpenAI,
                                                           served: tuple[str, ModelServer]) -> None:
    def ask(i: int) -> str:
        out = client.completions.create(model=MODEL, prompt=f"{i}+{i}=", max_tokens=16, seed=i,
                                        extra_body={"ignore_eos": True})
        return out.choices[0].text

    with ThreadPoolExecutor(32) as pool:
        texts = list(pool.map(ask, range(32)))
    assert len(texts) == 32 and all(texts)
    assert served[1].batcher.peak_running > 1, "concurrent requests were decoded one at a time"


def test_weight_update_changes_digest_and_outputs(tiny_model_dir: Path) -> None:
    with serving(tiny_model_dir) as (url, model_server):
        root = url.removesuffix("/v1")
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        greedy: dict[str, Any] = {"model": MODEL, "prompt": "12+34=", "max_tokens": 12, "temperature": 0.0,
                                  "extra_body": {"ignore_eos": True}}
        before_text = client.completions.create(**greedy).choices[0].text
        before = http_json("GET", f"{root}/v1/toolbox/weights/digest", KEY)[1]["sha256"]
        assert http_json("GET", f"{root}/v1/toolbox/info", KEY)[1]["weight_update"] is True
        state = {k: (v + 0.5 * torch.randn_like(v)).contiguous() for k, v in model_server.model.state_dict().items()}
        body = save(state)
        assert http_json("POST", f"{root}/v1/toolbox/weights", KEY, body)[0] == 401  # the API key is not the admin token
        assert http_json("POST", f"{root}/v1/toolbox/weights", ADMIN, body) == (200, {"loaded": len(state), "version": 1})
        after = http_json("GET", f"{root}/v1/toolbox/weights/digest", KEY)[1]["sha256"]
        assert after != before
        assert client.completions.create(**greedy).choices[0].text != before_text


def test_top_k_one_is_greedy_and_a_bad_top_k_is_a_400(client: openai.OpenAI) -> None:
    base: dict[str, Any] = {"model": MODEL, "prompt": "12+34=", "max_tokens": 12, "extra_body": {"ignore_eos": True}}
    greedy = client.completions.create(**base, temperature=0.0).choices[0].text
    hot = {**base, "extra_body": {"ignore_eos": True, "top_k": 1}}
    assert [client.completions.create(**hot, temperature=1.5, seed=s).choices[0].text for s in (1, 2)] == [greedy] * 2
    with pytest.raises(openai.BadRequestError, match="top_k must be -1, 0") as bad:
        client.completions.create(**{**base, "extra_body": {"top_k": -2}})
    assert bad.value.body["param"] == "top_k"  # type: ignore[index]


def test_streams_that_join_a_busy_batch_match_their_whole_responses_stop_strings_included(
        client: openai.OpenAI) -> None:
    def ask(i: int) -> tuple[str, str, str | None]:
        kwargs: dict[str, Any] = {"model": MODEL, "prompt": f"{i}+{i + 1}=", "max_tokens": 12 + i, "seed": i,
                                  "stop": ["5"], "extra_body": {"ignore_eos": True}}
        whole = client.completions.create(**kwargs).choices[0].text
        chunks = list(client.completions.create(**kwargs, stream=True))
        return whole, "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert all(whole == streamed and "5" not in streamed for whole, streamed, _ in answers)
    assert {finish for _, _, finish in answers} == {"stop", "length"}  # both kinds of ending were streamed
