"""The http engine against a fake `toolbox.commands.serve`: token ids from ``choices[].token_ids``, weight pushes.

The fake is a stdlib HTTP server on 127.0.0.1 that speaks the server's contract: ``GET /v1/toolbox/info``,
``POST /v1/toolbox/weights`` (safetensors body, admin bearer token) and ``/v1/completions`` with
``return_token_ids``. It records what the engine sent, so the tests check the request shape, that the
pushed bytes are the learner's tensors, that the token never reaches a log, and that a server without
the endpoint keeps the refusal. The real server is driven in tests/integration/test_http_engine_serve.py.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch
from safetensors.torch import load as load_safetensors

from toolbox.core.errors import ConfigError
from toolbox.engines import http as http_mod
from toolbox.engines.base import SamplingConfig
from toolbox.models.tiny import build_char_tokenizer
from toolbox.rl.batch import FINISH_STOP, PromptRequest
from toolbox.rl.weights import pack_state_dict

TOKEN = "s3cret-admin-token-for-tests"
A, B, EOS = 3, 4, 2  # char tokenizer over "abc": <pad> <s> </s> a b c


@dataclass
class FakeServe:
    """What the fake answers and what it received."""

    info_status: int = 200
    info: dict[str, Any] = field(default_factory=lambda: {"model": "tiny", "weight_update": True})
    weights_status: int = 200
    weights_failing: int = 0  # answer this many weight pushes 503 first
    loaded_offset: int = 0  # answer `loaded` off by this much (a server that dropped tensors)
    completions: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # the Authorization header of each completions request
    pushes: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    info_gets: int = 0
    busy: int = 0  # answer this many completions requests 429 (queue full) first
    failing: int = 0  # then this many 503 (a server restarting)
    slow: int = 0  # then answer this many only after a second (past a short timeout_s)

    def refusal(self) -> tuple[int, dict[str, Any]] | None:
        """The scripted answer to a completions request instead of its completions (None: complete it, slowly
        while ``slow`` lasts)."""
        if self.busy:
            self.busy -= 1
            return 429, {"error": {"message": "the server is busy", "type": "rate_limit_error", "param": None,
                                   "code": "queue_full"}}
        if self.failing:
            self.failing -= 1
            return 503, {"error": {"message": "restarting", "type": "server_error"}}
        if self.slow:
            self.slow -= 1
            time.sleep(1.0)
        return None


def choice(index: int) -> dict[str, Any]:
    """Choice ``index`` of a request: even ones "ab" + EOS, odd ones "b" + EOS (the text alone is ambiguous)."""
    ids = [A, B, EOS] if index % 2 == 0 else [B, EOS]
    return {"index": index, "text": "ab"[2 - len(ids) + 1:], "finish_reason": "stop", "token_ids": ids,
            "logprobs": {"tokens": ["?"] * len(ids), "token_logprobs": [-0.1 * (index + 1)] * len(ids),
                         "top_logprobs": None, "text_offset": None}}


def make_handler(state: FakeServe) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path != "/v1/toolbox/info":
                return self._reply(404, {"error": {"message": "not found"}})
            state.info_gets += 1
            self._reply(state.info_status, state.info if state.info_status == 200 else {"error": {}})

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/toolbox/weights":
                state.pushes.append((dict(self.headers), body))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._reply(401, {"error": {"message": "bad admin token"}})
                if state.weights_failing:
                    state.weights_failing -= 1
                    return self._reply(503, {"error": {"message": "loading"}})
                if state.weights_status != 200:
                    return self._reply(state.weights_status, {"error": {"message": "no"}})
                loaded = len(load_safetensors(body)) + state.loaded_offset
                return self._reply(200, {"loaded": loaded, "version": len(state.pushes)})
            request = json.loads(body)
            refusal = state.refusal()
            if refusal is not None:
                return self._reply(*refusal)
            state.completions.append(request)
            state.keys.append(self.headers.get("Authorization", ""))
            self._reply(200, {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "tiny",
                              "choices": [choice(i) for i in reversed(range(request["n"]))]})

        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

    return Handler


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeServe, str]]:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TOOLBOX_SERVE_ADMIN_TOKEN", TOKEN)
    state = FakeServe()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tok")
    build_char_tokenizer("abc").save_pretrained(path)
    return str(path)


def engine(tok_dir: str, url: str, **options: Any) -> http_mod.HTTPEngine:
    return http_mod.HTTPEngine(tok_dir, config=http_mod.HTTPEngineConfig(**{"base_url": url, "max_retries": 0,
                                                                            **options}))


def learner_state() -> dict[str, torch.Tensor]:
    """Tensors of several dtypes, an empty one, and a tied pair sharing memory (as tied embeddings export)."""
    emb = torch.randn(6, 4)
    return {"embed.weight": emb, "lm_head.weight": emb, "norm.weight": torch.rand(4).to(torch.bfloat16),
            "count": torch.tensor([7], dtype=torch.int64), "empty": torch.empty(0, 3)}


SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=4, stop_at_eos=True)
# Two groups: prompt [A] three times (group 0), prompt [B, A] once (group 1), with a row of group 1 between.
GROUPS = [PromptRequest([A], 0), PromptRequest([B, A], 1), PromptRequest([A], 0), PromptRequest([A], 0)]


def test_token_ids_come_from_choices_token_ids(fake: tuple[FakeServe, str], tok_dir: str) -> None:
    state, url = fake
    batch = engine(tok_dir, url).generate(GROUPS, SAMPLING)
    # Each row is choice k of its prompt's request, in index order though the fake answers in reverse; the
    # ids come from choices[].token_ids (re-tokenizing "ab" would not give the EOS).
    assert batch.response_ids_BR.tolist() == [[A, B, EOS], [A, B, EOS], [B, EOS, 0], [A, B, EOS]]
    assert torch.allclose(batch.logprobs_BR[:, 0], torch.tensor([-0.1, -0.1, -0.2, -0.3]))
    assert batch.finish_B.tolist() == [FINISH_STOP] * 4
    assert all(r["return_token_ids"] is True and "return_tokens_as_token_ids" not in r for r in state.completions)
    assert sorted((r["prompt"], r["n"]) for r in state.completions) == [([A], 3), ([B, A], 1)]
    assert len({r["seed"] for r in state.completions}) == 2


def test_one_request_per_sample_when_n_per_prompt_is_off(fake: tuple[FakeServe, str], tok_dir: str) -> None:
    state, url = fake
    batch = engine(tok_dir, url, n_per_prompt=False).generate(GROUPS, SAMPLING)
    assert batch.response_ids_BR.tolist() == [[A, B, EOS]] * 4
    assert sorted((r["prompt"], r["n"]) for r in state.completions) == [([A], 1)] * 3 + [([B, A], 1)]
    assert len({r["seed"] for r in state.completions}) == 4


def test_push_sends_the_learner_tensors_with_the_admin_token(
        fake: tuple[FakeServe, str], tok_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    state, url = fake
    sd = learner_state()
    with caplog.at_level(logging.DEBUG):
        eng = engine(tok_dir, url)
        assert eng.server == http_mod.ServerInfo(ours=True, weight_update=True, model="tiny",
                                                 note=f"GET {url}/toolbox/info: weight_update=True")
        loaded = eng.update_weights(pack_state_dict(sd, bucket_bytes=64))
    assert loaded == sum(t.numel() * t.element_size() for t in sd.values())
    (headers, body), = state.pushes
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    received = load_safetensors(body)
    assert received.keys() == sd.keys()
    for name, tensor in sd.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name
    assert "pushed 5 tensors" in caplog.text
    assert TOKEN not in caplog.text
    assert TOKEN not in eng.config.model_dump_json()  # only the variable's name is config


def test_rejected_push_names_url_and_status(fake: tuple[FakeServe, str], tok_dir: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    state, url = fake
    eng = engine(tok_dir, url)
    monkeypatch.setenv("TOOLBOX_SERVE_ADMIN_TOKEN", "wrong")
    with pytest.raises(RuntimeError, match=rf"{url}/toolbox/weights was rejected with status 401") as err:
        eng.update_weights(pack_state_dict({"w": torch.ones(2)}))
    assert "wrong" not in str(err.value)
    monkeypatch.setenv("TOOLBOX_SERVE_ADMIN_TOKEN", TOKEN)
    state.weights_status = 422
    with pytest.raises(RuntimeError, match="status 422"):
        eng.update_weights(pack_state_dict({"w": torch.ones(2)}))


def test_a_push_the_server_failed_is_sent_again_and_counted(fake: tuple[FakeServe, str], tok_dir: str) -> None:
    from toolbox.core.retry import take_retries

    state, url = fake
    take_retries()
    state.weights_failing = 1
    assert engine(tok_dir, url, max_retries=1).update_weights(pack_state_dict({"w": torch.ones(2)})) == 8
    assert len(state.pushes) == 2 and take_retries() == 1
    state.weights_failing = 2
    with pytest.raises(RuntimeError, match=rf"{url}/toolbox/weights was rejected with status 503: .*loading"):
        engine(tok_dir, url, max_retries=1).update_weights(pack_state_dict({"w": torch.ones(2)}))


def test_a_server_that_loads_fewer_tensors_is_an_error(fake: tuple[FakeServe, str], tok_dir: str) -> None:
    state, url = fake
    state.loaded_offset = -1
    with pytest.raises(RuntimeError, match="sent 2 tensors, the server loaded 1"):
        engine(tok_dir, url).update_weights(pack_state_dict({"w": torch.ones(2), "b": torch.ones(1)}))


def test_missing_admin_token_warns_at_start_and_fails_the_push(
        fake: tuple[FakeServe, str], tok_dir: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    state, url = fake
    monkeypatch.setenv("MY_TOKEN_VAR", TOKEN)
    monkeypatch.delenv("TOOLBOX_SERVE_ADMIN_TOKEN")
    with caplog.at_level("WARNING"):
        eng = engine(tok_dir, url)  # an evaluation that never pushes must still start
    assert "TOOLBOX_SERVE_ADMIN_TOKEN is not set" in caplog.text
    with pytest.raises(ConfigError, match="TOOLBOX_SERVE_ADMIN_TOKEN is not set"):
        eng.update_weights(pack_state_dict({"w": torch.ones(1)}))
    assert state.pushes == []
    assert engine(tok_dir, url, admin_token_env="MY_TOKEN_VAR").update_weights(pack_state_dict({"w": torch.ones(1)}))
    with pytest.raises(ValueError, match="admin_token_env"):  # a token pasted in place of a variable name
        http_mod.HTTPEngineConfig(admin_token_env="abc-def/ghi")


@pytest.mark.parametrize("info_status, info, push_weights, why", [
    (404, {}, True, "toolbox/info answered 404"),  # vLLM, SGLang: not ours
    (200, {"model": "tiny", "weight_update": False}, True, "weight_update=False"),  # ours, no admin token set
    (200, {"model": "tiny", "weight_update": True}, False, "push_weights is false"),  # ours, pushing turned off
])
def test_servers_without_weight_updates_keep_the_refusal(
        fake: tuple[FakeServe, str], tok_dir: str, caplog: pytest.LogCaptureFixture,
        info_status: int, info: dict[str, Any], push_weights: bool, why: str) -> None:
    state, url = fake
    state.info_status, state.info = info_status, info
    buckets = pack_state_dict({"w": torch.ones(2)})
    with pytest.raises(NotImplementedError, match=why):
        engine(tok_dir, url, push_weights=push_weights).update_weights(buckets)
    with caplog.at_level("WARNING"):
        assert engine(tok_dir, url, push_weights=push_weights, allow_stale_weights=True).update_weights(buckets) == 0
    assert "keeps its own weights" in caplog.text
    assert state.pushes == []


def test_server_down_at_start_is_asked_again_at_the_update(tok_dir: str) -> None:
    with socket.socket() as sock:  # a port nobody listens on once the socket closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    eng = engine(tok_dir, f"http://127.0.0.1:{port}/v1")
    assert eng.server is None
    with pytest.raises(http_mod.ServerUnreachableError, match=f"127.0.0.1:{port}/v1/toolbox/info: no answer"):
        eng.update_weights(pack_state_dict({"w": torch.ones(2)}))


def test_api_key_comes_from_the_named_variable(fake: tuple[FakeServe, str], tok_dir: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    state, url = fake
    monkeypatch.setenv("MY_API_KEY", "k-123")
    eng = engine(tok_dir, url, api_key_env="MY_API_KEY")
    eng.generate(GROUPS[:1], SAMPLING)
    assert state.keys == ["Bearer k-123"]
    assert "k-123" not in eng.config.model_dump_json()
    monkeypatch.delenv("MY_API_KEY")
    with pytest.raises(ConfigError, match="api_key_env: the environment variable MY_API_KEY is not set"):
        engine(tok_dir, url, api_key_env="MY_API_KEY")


def test_api_key_in_the_config_reaches_the_server_and_no_dump(fake: tuple[FakeServe, str], tok_dir: str) -> None:
    state, url = fake
    eng = engine(tok_dir, url, api_key="sk-live-123")
    eng.generate(GROUPS[:1], SAMPLING)
    assert state.keys[-1] == "Bearer sk-live-123"
    for dumped in (eng.config.model_dump_json(), repr(eng.config), str(eng.config.model_dump(mode="json"))):
        assert "sk-live-123" not in dumped


def test_training_asks_the_server_before_ray_starts(fake: tuple[FakeServe, str]) -> None:
    state, url = fake
    config = http_mod.HTTPEngineConfig(base_url=url)
    assert config.training_problem(probe=True) == ""  # ours, taking weights
    for status, info, why in [(404, {}, " answered 404"),
                              (200, {"model": "tiny", "weight_update": False}, ": weight_update=False: start toolbox")]:
        state.info_status, state.info = status, info
        with pytest.raises(ConfigError, match=f"rollout.engine: the http engine's server at {url} does not take the "
                                              f"learner's weight updates \\(GET {url}/toolbox/info{why}"):
            config.check_training(probe=True)
        http_mod.HTTPEngineConfig(base_url=url, allow_stale_weights=True).check_training(probe=True)
    state.info_status = 401  # a key the driver does not hold: cannot be told here, the rollout worker asks again
    assert config.training_problem(probe=True) == ""


def test_a_busy_server_is_waited_out_then_named(fake: tuple[FakeServe, str], tok_dir: str) -> None:
    """429s (a full queue) are sent again, however few retries the client makes, until rollout.engine.timeout_s."""
    state, url = fake
    state.busy = 5
    batch = engine(tok_dir, url, max_concurrency=1).generate(GROUPS, SAMPLING)
    assert len(batch) == 4 and state.busy == 0 and len(state.completions) == 2
    state.busy = 10**9
    with pytest.raises(RuntimeError, match=rf"rows \[.*\] \({url}\): the server answered 429 \(busy\) for 0.3s "
                                           r"\(rollout.engine.timeout_s\).*lower rollout.engine.max_concurrency"):
        engine(tok_dir, url, timeout_s=0.3).generate(GROUPS, SAMPLING)


def test_failed_requests_are_retried_by_the_one_policy_and_counted(fake: tuple[FakeServe, str], tok_dir: str) -> None:
    """A 503 is sent again up to max_retries times (the openai client itself retries nothing), each retry counted
    for the step's ``retries`` metric; past max_retries the server's error is raised as it was."""
    import openai

    from toolbox.core.retry import take_retries

    state, url = fake
    take_retries()
    state.failing = 2
    batch = engine(tok_dir, url, max_retries=2).generate(GROUPS, SAMPLING)
    assert len(batch) == 4 and state.failing == 0 and len(state.completions) == 2 and take_retries() == 2
    state.failing = 3
    with pytest.raises(openai.InternalServerError, match="restarting"):
        engine(tok_dir, url, max_retries=1).generate(GROUPS[:1], SAMPLING)
    assert state.failing == 1 and take_retries() == 1
    state.failing, state.slow = 0, 1  # a try that timed out still leaves the next its own timeout_s
    assert len(engine(tok_dir, url, max_retries=1, timeout_s=0.5).generate(GROUPS[:1], SAMPLING)) == 1
    assert take_retries() == 1
