"""The HTTP engine: sample from an OpenAI-compatible server's ``/v1/completions`` (vLLM, SGLang, ...).

Prompts go out as token-id lists and come back with one log-prob per token (``logprobs=1``). Token
ids are read from the response when the server gives them (``choices[].token_ids``, or vLLM's
``return_tokens_as_token_ids`` which spells each token "token_id:N"); otherwise the text is
tokenized again with the model's tokenizer, and a row whose token count then disagrees with its
log-prob count is an error rather than a misaligned sample.

The server's weights are not ours: `update_weights` refuses unless ``allow_stale_weights`` says
the run knowingly samples from a fixed policy (evaluation, a frozen reference, an external judge).
"""

from __future__ import annotations

import logging
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.engines.common import Sample, batch_from_samples, finish_code, request_seeds
from toolbox.models.loading import load_tokenizer
from toolbox.rl.batch import FINISH_STOP, PromptRequest, RolloutBatch
from toolbox.rl.weights import WeightBucket

log = logging.getLogger(__name__)
TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token under return_tokens_as_token_ids


class HTTPEngineConfig(BaseModel):
    """Options of the ``http`` engine (an OpenAI-compatible completions server)."""

    model_config = ConfigDict(extra="forbid")
    base_url: str = Field(default="http://127.0.0.1:8000/v1", description="Server URL up to and including /v1.")
    api_key: str = Field(default="EMPTY", description="Bearer token; local vLLM/SGLang servers accept any value.")
    model: str = Field(default="", description="Model name the server serves; empty: the model path.")
    timeout_s: float = Field(default=600.0, gt=0.0, description="Seconds one completion request may take.")
    max_concurrency: int = Field(default=32, ge=1, description="Completion requests in flight at once.")
    max_retries: int = Field(default=2, ge=0, description="Retries of a failed request (connection error, 5xx, 429).")
    server_token_ids: bool = Field(
        default=True,
        description="Ask for token ids (vLLM's return_tokens_as_token_ids) so text need not be "
        "re-tokenized; turn off for a server that rejects unknown request fields.",
    )
    seeded: bool = Field(
        default=True, description="Send each request its own seed (reproducible where the server honours it)."
    )
    allow_stale_weights: bool = Field(
        default=False,
        description="Let update_weights return without loading (the server keeps its own weights): "
        "only for sampling from a fixed policy.",
    )


@ENGINES.register("http", config=HTTPEngineConfig)
class HTTPEngine:
    """Samples from an OpenAI-compatible server with the ``openai`` client, one request per prompt."""

    def __init__(self, model_path: str, dtype: str = "float32", config: HTTPEngineConfig | None = None,
                 seed: int = 0, trust_remote_code: bool = False) -> None:
        import openai  # lazy: only this engine needs the client

        self.config = cfg = config or HTTPEngineConfig()
        self.tokenizer = load_tokenizer(model_path, trust_remote_code)
        self.model = cfg.model or model_path
        self.client = openai.OpenAI(
            base_url=cfg.base_url, api_key=cfg.api_key, timeout=cfg.timeout_s, max_retries=cfg.max_retries
        )
        self._rng = random.Random(seed)

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        seeds = request_seeds(self._rng, len(requests), self.config.seeded)
        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            samples = list(pool.map(lambda i: self._complete(requests[i], sampling, seeds[i], i), range(len(requests))))
        return batch_from_samples(requests, samples, int(self.tokenizer.pad_token_id))

    def _complete(self, request: PromptRequest, sampling: SamplingConfig, seed: int | None, row: int) -> Sample:
        extra: dict[str, Any] = {}
        if self.config.server_token_ids:
            extra["return_tokens_as_token_ids"] = True
        if not sampling.stop_at_eos:
            extra["ignore_eos"] = True  # vLLM / SGLang extension; OpenAI itself has no such switch
        kwargs: dict[str, Any] = {"seed": seed} if seed is not None else {}
        response = self.client.completions.create(
            model=self.model,
            prompt=list(request.ids),
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            n=1,
            logprobs=1,
            extra_body=extra or None,
            **kwargs,
        )
        choice = response.choices[0]
        where = f"http engine row {row} ({self.config.base_url})"
        finish = finish_code(choice.finish_reason, where)
        if choice.logprobs is None or choice.logprobs.token_logprobs is None:
            raise RuntimeError(f"{where}: the server returned no log-probs; it must support logprobs=1")
        logprobs = choice.logprobs.token_logprobs
        if any(lp is None for lp in logprobs):
            raise RuntimeError(f"{where}: the server returned a null log-prob for a sampled token")
        ids = self._response_ids(choice, len(logprobs), finish, sampling.stop_at_eos)
        if len(ids) != len(logprobs):
            raise RuntimeError(
                f"{where}: {len(ids)} tokens after re-tokenizing the text but {len(logprobs)} log-probs; "
                "use a server that returns token ids (http.server_token_ids: true)"
            )
        return Sample(ids, [float(lp) for lp in logprobs], finish)

    def _response_ids(self, choice: Any, n_logprobs: int, finish: int, stop_at_eos: bool) -> list[int]:
        """Token ids of a choice: from the server if it sent them, else by tokenizing the text."""
        server_ids = (choice.model_extra or {}).get("token_ids")
        if server_ids is not None:
            return [int(t) for t in server_ids]
        tokens = choice.logprobs.tokens or []
        if tokens and all(t.startswith(TOKEN_ID_PREFIX) for t in tokens):
            return [int(t.removeprefix(TOKEN_ID_PREFIX)) for t in tokens]
        ids = list(self.tokenizer.encode(choice.text, add_special_tokens=False))
        # The server counts the EOS it stopped on among the log-probs but leaves it out of the text.
        if stop_at_eos and finish == FINISH_STOP and n_logprobs == len(ids) + 1:
            ids.append(int(self.tokenizer.eos_token_id))
        return ids

    def update_weights(self, buckets: list[WeightBucket]) -> int:
        if not self.config.allow_stale_weights:
            raise NotImplementedError(
                f"http engine: the server at {self.config.base_url} owns its weights, so the learner's "
                "update cannot reach it and on-policy training would silently sample a stale policy. "
                "Use the vllm or sglang engine for training, or set http.allow_stale_weights: true to "
                "sample from a fixed policy on purpose."
            )
        log.warning("http engine: skipping a weight update of %d buckets; %s keeps its own weights",
                    len(buckets), self.config.base_url)
        return 0

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError("http engine: the server's weights are not readable through the completions API")
