"""The HTTP engine: sample from an OpenAI-compatible server's ``/v1/completions`` (ours, vLLM, SGLang, ...).

Prompts go out as token-id lists, the samples of one prompt as one request with ``n``, and come back
with one log-prob per token (``logprobs=1``). Token ids are read from the response when the server
gives them (``choices[].token_ids``, asked for with ``return_token_ids``: our server and recent vLLM;
or older vLLM's ``return_tokens_as_token_ids``, which spells each token "token_id:N"); otherwise the
text is tokenized again with the model's tokenizer, and a row whose token count then disagrees with
its log-prob count is an error rather than a misaligned sample.

Seeds: each request carries its own ``seed`` (``seeded``), drawn from the rollout worker's global torch
generator, which checkpoints save and resumes restore; a server that honours ``seed`` (`toolbox serve`,
vLLM's OpenAI server) then samples a resumed run's rollouts exactly as the uninterrupted run's, given the
same weights. A server that ignores it (or batches seeded requests non-deterministically) does not.

Behaviour log-probs must follow the training definition, ``log_softmax(logits / T)`` of the sampled token
(what the hf engine and the learners compute). A vLLM server reports ``--logprobs-mode raw_logprobs`` by
default: the log-probs of the logits *before* temperature, which do not match unless T = 1. Start vLLM with
``--logprobs-mode processed_logprobs``. SGLang's ``output_token_logprobs`` already follow the definition
(unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set).

Weights: at start the engine asks ``GET {base_url}/toolbox/info`` whether the server is our own
(`toolbox serve`) with its weight-update endpoint on. If so, `update_weights` posts the learner's
full state dict there as one safetensors body, authorised by an admin token read from the
environment variable ``admin_token_env`` (the token is never in the config, never logged). Any other
server owns its weights: `update_weights` refuses unless ``allow_stale_weights`` says the run
knowingly samples from a fixed policy (evaluation, a frozen reference, an external judge).
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from toolbox.core.errors import ConfigError
from toolbox.core.retry import RetryPolicy
from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.engines.common import (
    Sample,
    batch_from_samples,
    call_rng,
    finish_code,
    request_seeds,
)
from toolbox.engines.http_config import HTTPEngineConfig
from toolbox.engines.http_server import (
    PushFailedError,
    ServerInfo,
    ServerUnreachableError,
    http_request,
    probe_server,
    safetensors_payload,
    snippet,
    stale_weights_message,
)
from toolbox.models.loading import load_tokenizer
from toolbox.rl.batch import FINISH_STOP, PromptRequest, RolloutBatch
from toolbox.rl.weights import WeightBucket

log = logging.getLogger(__name__)
TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token under return_tokens_as_token_ids
BUSY_FIRST_PAUSE_S, BUSY_MAX_PAUSE_S = 0.05, 1.0  # between tries of a request a busy server refused (429)


def prompt_rows(requests: list[PromptRequest]) -> list[list[int]]:
    """Batch rows grouped by identical prompt (same group, same ids), in first-seen order: one request each."""
    rows: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for i, request in enumerate(requests):
        rows.setdefault((request.group, tuple(request.ids)), []).append(i)
    return list(rows.values())


def request_failed(err: BaseException) -> bool:
    """Whether a completions request is worth sending again: it got no answer (no connection, a timeout: the
    client's ``APIConnectionError``) or a 408 or 5xx one. Not a 429 (waited out apart) nor another 4xx (a bad
    request or a refused key fails the same way every time)."""
    import openai

    if isinstance(err, openai.APIConnectionError):
        return True
    return isinstance(err, openai.APIStatusError) and (err.status_code == 408 or err.status_code >= 500)


@ENGINES.register("http", config=HTTPEngineConfig)
class HTTPEngine:
    """Samples from an OpenAI-compatible server with the ``openai`` client, one request (``n`` samples) per prompt."""

    def __init__(self, model_path: str, dtype: str = "float32", config: HTTPEngineConfig | None = None,
                 seed: int = 0, trust_remote_code: bool = False) -> None:
        import openai  # lazy: only this engine needs the client

        self.config = cfg = config or HTTPEngineConfig()
        self.tokenizer = load_tokenizer(model_path, trust_remote_code)
        self.model = cfg.model or model_path
        self._api_key = (self._secret(cfg.api_key_env, "api_key_env") if cfg.api_key_env
                         else cfg.api_key.get_secret_value())
        self.client = openai.OpenAI(
            base_url=cfg.base_url, api_key=self._api_key, timeout=cfg.timeout_s, max_retries=0  # retried in `_create`
        )
        torch.manual_seed(seed)  # the per-request seeds are drawn from this process's (checkpointed) torch stream
        self.server: ServerInfo | None = None  # None: not known yet (the server did not answer at start)
        try:
            self.server = probe_server(cfg.base_url, self._api_key)
        except ServerUnreachableError as err:
            log.warning("http engine: %s; asking again at the first weight update", err)
        if self._pushes() and not os.environ.get(cfg.admin_token_env):
            # Not an error yet: an evaluation never pushes. A training run fails at its first weight sync.
            log.warning("http engine: %s takes weight pushes but %s is not set here; a weight update will fail",
                        cfg.base_url, cfg.admin_token_env)

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        rows = prompt_rows(requests) if self.config.n_per_prompt else [[i] for i in range(len(requests))]
        seeds = request_seeds(call_rng(), len(rows), self.config.seeded)

        def complete(k: int) -> list[Sample]:
            return self._complete(requests[rows[k][0]], len(rows[k]), sampling, seeds[k], rows[k])

        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            answers = list(pool.map(complete, range(len(rows))))
        samples: list[Sample | None] = [None] * len(requests)
        for group, answer in zip(rows, answers):
            for row, sample in zip(group, answer):
                samples[row] = sample
        return batch_from_samples(requests, [s for s in samples if s is not None], int(self.tokenizer.pad_token_id))

    def _complete(self, request: PromptRequest, n: int, sampling: SamplingConfig, seed: int | None,
                  rows: list[int]) -> list[Sample]:
        """One completions request for ``n`` samples of ``request`` (the batch rows ``rows``)."""
        extra: dict[str, Any] = {}
        if self.config.server_token_ids:
            extra[self.config.token_ids_field] = True
        if not sampling.stop_at_eos:
            extra["ignore_eos"] = True  # vLLM / SGLang extension; OpenAI itself has no such switch
        kwargs: dict[str, Any] = {"seed": seed} if seed is not None else {}
        where = f"http engine rows {rows} ({self.config.base_url})"
        response = self._create(where, model=self.model, prompt=list(request.ids), max_tokens=sampling.max_new_tokens,
                                temperature=sampling.temperature, top_p=sampling.top_p, n=n, logprobs=1,
                                extra_body=extra or None, **kwargs)
        if len(response.choices) != n:
            raise RuntimeError(f"{where}: asked for n={n} completions, the server returned {len(response.choices)}")
        choices = sorted(response.choices, key=lambda c: c.index)
        return [self._sample(c, sampling, f"http engine row {row} ({self.config.base_url})")
                for row, c in zip(rows, choices)]

    def _failed_policy(self) -> RetryPolicy:
        """How a failed request or push is tried again: ``max_retries`` more times, each try allowed ``timeout_s``
        (so a timed-out try still leaves time for the next)."""
        c = self.config
        return RetryPolicy(attempts=c.max_retries + 1, deadline_s=c.timeout_s * (c.max_retries + 1))

    def _create(self, where: str, **request: Any) -> Any:
        """``completions.create`` under the one retry policy (`toolbox.core.retry`; the client itself retries nothing).

        A request that fails (no connection, a timeout, a 408 or 5xx answer) is sent again up to ``max_retries``
        times. A 429 (the server's queue has no room for the request's choices: other workers' requests fill it) is
        waited out: sent again after a jittered pause that doubles up to BUSY_MAX_PAUSE_S until ``timeout_s`` has
        passed since the first try; then the step fails, naming what to change. Every retry is counted."""
        import openai

        failed = self._failed_policy()
        busy = RetryPolicy(attempts=10**6, first_pause_s=BUSY_FIRST_PAUSE_S, max_pause_s=BUSY_MAX_PAUSE_S,
                           deadline_s=self.config.timeout_s)  # bounded by the deadline, not a count

        def once() -> Any:
            return failed.call(lambda: self.client.completions.create(**request), what="http engine request",
                               retryable=request_failed)

        try:
            return busy.call(once, what="http engine request (429)",
                             retryable=lambda err: isinstance(err, openai.RateLimitError),
                             level=logging.DEBUG)  # a busy server is routine under load: counted, not shouted
        except openai.RateLimitError as err:
            raise RuntimeError(
                f"{where}: the server answered 429 (busy) for {self.config.timeout_s:g}s "
                f"(rollout.engine.timeout_s): {err}; lower rollout.engine.max_concurrency or "
                "rollout.num_workers, or raise the server's max_queue") from err

    def _sample(self, choice: Any, sampling: SamplingConfig, where: str) -> Sample:
        """One choice as a `Sample`; a missing or misaligned log-prob is an error naming ``where``."""
        finish = finish_code(choice.finish_reason, where)
        if choice.logprobs is None or choice.logprobs.token_logprobs is None:
            raise RuntimeError(f"{where}: the server returned no log-probs; it must support logprobs=1")
        logprobs = choice.logprobs.token_logprobs
        if any(lp is None for lp in logprobs):
            raise RuntimeError(f"{where}: the server returned a null log-prob for a sampled token")
        ids = self._response_ids(choice, len(logprobs), finish, sampling.stop_at_eos)
        if len(ids) != len(logprobs):
            raise RuntimeError(
                f"{where}: {len(ids)} response tokens but {len(logprobs)} log-probs; "
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

    def _pushes(self) -> bool:
        """Whether weight updates go to the server (it is ours, with the endpoint on, and pushing is wanted)."""
        return self.config.push_weights and self.server is not None and self.server.weight_update

    def _admin_token(self) -> str:
        return self._secret(self.config.admin_token_env, "admin_token_env",
                            f"the server at {self.config.base_url} takes weight pushes, and ",
                            "; or set rollout.engine.push_weights: false to sample from its weights as they are")

    def _secret(self, name: str, field: str, context: str = "", hint: str = "") -> str:
        """The value of the environment variable ``name`` (named by config ``field``); `ConfigError` if unset."""
        value = os.environ.get(name, "")
        if not value:
            raise ConfigError(f"rollout.engine.{field}: {context}the environment variable {name} is not set on "
                              f"this rollout worker; set it to the server's secret{hint}")
        return value

    def update_weights(self, buckets: list[WeightBucket]) -> int:
        """Push the learner's weights to our server; returns the bytes loaded (0 when knowingly stale)."""
        if self.server is None:  # the server did not answer at start: ask again, and now a silence is an error
            self.server = probe_server(self.config.base_url, self._api_key)
        if self._pushes():
            return self._push(buckets)
        if not self.config.allow_stale_weights:
            why = self.server.note if self.config.push_weights else "rollout.engine.push_weights is false"
            raise NotImplementedError(stale_weights_message(self.config.base_url, why))
        log.warning("http engine: skipping a weight update of %d buckets; %s keeps its own weights",
                    len(buckets), self.config.base_url)
        return 0

    def _push(self, buckets: list[WeightBucket]) -> int:
        """POST the full state dict as safetensors to ``<base_url>/toolbox/weights`` (sent again, under the one retry
        policy, up to ``max_retries`` times when the server did not answer or answered 408 or 5xx); check the server
        loaded all."""
        url = f"{self.config.base_url.rstrip('/')}/toolbox/weights"
        payload, count, nbytes = safetensors_payload(buckets)
        headers = {"Authorization": f"Bearer {self._admin_token()}", "Content-Type": "application/octet-stream"}

        def post() -> tuple[int, bytes]:
            status, body = http_request(url, method="POST", headers=headers, body=payload, timeout_s=self.config.timeout_s)
            if status == 408 or status >= 500:  # the whole state dict again is the same push: safe to repeat
                raise PushFailedError(status, body)
            return status, body

        policy = self._failed_policy()
        try:
            status, body = policy.call(post, what="http engine weight push",
                                       retryable=lambda err: isinstance(err, ServerUnreachableError | PushFailedError))
        except PushFailedError as err:
            status, body = err.status, err.body
        if status != 200:
            raise RuntimeError(f"http engine: weight push of {count} tensors to {url} was rejected with status "
                               f"{status}: {snippet(body)}")
        try:
            answer = json.loads(body)
            loaded, version = int(answer["loaded"]), answer.get("version")
        except (ValueError, KeyError, TypeError):
            raise RuntimeError(f"http engine: weight push to {url} answered 200 but not with "
                               f"{{'loaded': n, 'version': k}}: {snippet(body)}") from None
        if loaded != count:
            raise RuntimeError(f"http engine: weight push to {url}: sent {count} tensors, the server loaded {loaded}")
        log.info("http engine: pushed %d tensors (%.1f MB) to %s, server weight version %s",
                 count, nbytes / 2**20, url, version)
        return nbytes

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError("http engine: the server's weights are not readable through the completions API "
                                  "(toolbox serve publishes a digest at <base_url>/toolbox/weights/digest)")

