"""The server backend over any registered `InferenceEngine` (``vllm``, ``sglang``, ``hf``, a plugin's).

Dynamic batching, not continuous batching: one thread takes every waiting choice (up to ``max_batch_size``)
and hands them to the engine in one ``engine.generate(requests, sampling)`` call per distinct sampling setting
(temperature, top_p, EOS handling); requests that arrive while that call runs wait and form the next batch.
Each row of the returned `RolloutBatch` (left-padded prompt, right-padded response, behaviour log-probs,
finish code; rows in request order) is replayed token by token into its `Sequence`, which applies ``stop``
strings (the engines' `SamplingConfig` has none, so the text is cut here), the request's own ``max_tokens``
(the engine ran to the batch's largest) and EOS. Streaming therefore sends a choice's chunks only once the
whole batch has finished: not incremental. Only the sampled token's log-prob exists (``logprobs`` /
``top_logprobs`` > 0 is a 400), and a request's ``seed`` is not honoured (the engine seeds its own sampling).

The KV-cache continuous batcher (`toolbox.serving.scheduler.ContinuousBatcher`) stays the ``engine=hf`` path.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from transformers import AutoConfig

from toolbox.engines.base import ENGINES, InferenceEngine, SamplingConfig
from toolbox.rl.batch import FINISH_STOP, PromptRequest, RolloutBatch
from toolbox.rl.weights import pack_state_dict
from toolbox.serving.config import ServeConfig
from toolbox.serving.protocol import ApiError
from toolbox.serving.sampling import Choice
from toolbox.serving.scheduler import BatchLoop
from toolbox.serving.sequence import SamplingParams, Sequence, publish
from toolbox.serving.server import Running, ServedModel
from toolbox.serving.weights import digest_of, read_payload

log = logging.getLogger(__name__)


def sampling_key(params: SamplingParams) -> tuple[float, float, bool]:
    """The settings an engine call shares: choices that differ here need separate ``generate`` calls."""
    return params.temperature, params.top_p, not params.ignore_eos


def replay(seq: Sequence, batch: RolloutBatch, row: int) -> None:
    """Feed row ``row`` of ``batch`` into ``seq`` token by token; the engine's finish marks the last token."""
    length = int(batch.response_mask_BR[row].sum())
    if length == 0:
        raise RuntimeError("the engine returned an empty completion")
    ids = batch.response_ids_BR[row, :length].tolist()
    logprobs = batch.logprobs_BR[row, :length].tolist()
    ended = "stop" if int(batch.finish_B[row]) == FINISH_STOP else "length"
    for i, (token, logprob) in enumerate(zip(ids, logprobs, strict=True)):
        if seq.done:
            return
        seq.append(Choice(int(token), float(logprob), []), ended if i == length - 1 else None)


class EngineBatcher(BatchLoop):
    """Dynamic batching over an `InferenceEngine`: each step is one ``generate`` call per sampling setting."""

    def __init__(self, engine: InferenceEngine, max_batch_size: int = 32, max_queue: int = 256) -> None:
        super().__init__(max_batch_size, max_queue, "toolbox-serve-engine")
        self.engine = engine
        self.generate_calls = 0  # tests read it: fewer calls than requests means requests were batched

    def _step(self, newcomers: list[Sequence]) -> None:
        groups: dict[tuple[float, float, bool], list[Sequence]] = defaultdict(list)
        for seq in newcomers:
            groups[sampling_key(seq.params)].append(seq)
        for (temperature, top_p, stop_at_eos), seqs in groups.items():
            sampling = SamplingConfig(temperature=temperature, top_p=top_p, stop_at_eos=stop_at_eos,
                                      max_new_tokens=max(s.params.max_tokens for s in seqs))
            self._generate(seqs, sampling)
        self.steps += 1

    def _generate(self, seqs: list[Sequence], sampling: SamplingConfig) -> None:
        """One engine call for ``seqs``; a failure fails these choices only, not the server."""
        try:
            requests = [PromptRequest(list(s.prompt_ids), group=i) for i, s in enumerate(seqs)]
            self.generate_calls += 1
            batch = self.engine.generate(requests, sampling)
            if len(batch) != len(seqs):
                raise RuntimeError(f"the engine returned {len(batch)} rows for {len(seqs)} prompts")
            for row, seq in enumerate(seqs):
                replay(seq, batch, row)
        except Exception as err:  # any engine failure becomes a 500 for the requests in this call
            log.exception("toolbox serve: engine.generate failed")
            failed = [seq for seq in seqs if not seq.done]
            for seq in failed:
                seq.cancelled = True
            publish([(seq, err) for seq in failed])


def build_engine(config: ServeConfig) -> InferenceEngine:
    """``config.engine`` built from the registry with ``config.engine_options``, as a rollout worker builds it."""
    spec = {"name": config.engine, **config.engine_options}
    inject = {"model_path": config.model_dir(), "dtype": config.dtype, "seed": config.seed,
              "trust_remote_code": config.trust_remote_code}
    return ENGINES.build(spec, inject=inject)


class EngineServer(ServedModel):
    """The engine backend: an `EngineBatcher` over ``engine`` (built from the config unless given)."""

    batcher: EngineBatcher

    def __init__(self, config: ServeConfig, engine: InferenceEngine | None = None) -> None:
        super().__init__(config)
        model_config = AutoConfig.from_pretrained(config.model_dir(), trust_remote_code=config.trust_remote_code)
        self.vocab_size = int(model_config.vocab_size)
        self.context = int(getattr(model_config, "max_position_embeddings", 0) or 2048)
        self.engine = build_engine(config) if engine is None else engine
        self.batcher = EngineBatcher(self.engine, config.max_batch_size, config.max_queue)

    def start_choices(self, prompt_ids: list[int], params: SamplingParams, n: int, seed: int | None,
                      stream: bool = False) -> Running:
        if params.num_top:
            raise ApiError(400, f"engine={self.config.engine} reports only the sampled token's log-prob; "
                           "ask for logprobs=0 (completions) or top_logprobs=0 (chat)", "logprobs")
        if params.top_k:
            raise ApiError(400, f"engine={self.config.engine} samples from every token (its SamplingConfig has no "
                           "top_k); leave top_k out", "top_k")
        return super().start_choices(prompt_ids, params, n, seed, stream)

    def load_weights(self, payload: bytes) -> dict[str, int]:
        """``engine.update_weights`` with the pushed state dict in buckets, between batches; bump the version."""
        try:
            state = read_payload(payload)
        except ValueError as err:
            raise ApiError(400, str(err), "body", "bad_weights") from err
        buckets = pack_state_dict(state, self.config.weight_bucket_mb << 20)
        self.batcher.run_between_steps(lambda: self.engine.update_weights(buckets))
        self.version += 1
        return {"loaded": len(state), "version": self.version}

    def digest(self) -> dict[str, Any]:
        """The digest of ``engine.state_dict()``; a 404 if the engine cannot hand its weights out."""
        state_dict = getattr(self.engine, "state_dict", None)
        try:
            if not callable(state_dict):
                raise NotImplementedError("it has no state_dict()")
            state = self.batcher.run_between_steps(state_dict)
        except NotImplementedError as err:
            raise ApiError(404, f"engine={self.config.engine} cannot report its weights, so there is no digest: "
                           f"{err}", None, "digest_unsupported") from err
        return {"sha256": digest_of(state), "version": self.version}
