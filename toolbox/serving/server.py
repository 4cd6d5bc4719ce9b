"""The served model behind the routes: tokenizer, batcher, weight version, and request plumbing.

`ServedModel` is what every backend shares; `ModelServer` is the ``hf`` backend (continuous batching over a
``transformers`` model) and `toolbox.serving.engine_backend.EngineServer` the one over any registered
`InferenceEngine`. `ServedModel.start_choices` turns one request into ``n`` `Sequence` s on the batcher and returns an
`asyncio.Queue` of ``(choice index, Delta)``; the routes in `toolbox.serving.app` read it either to the end (a
JSON response) or as it fills (server-sent events).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import torch

from toolbox.models.loading import load_causal_lm, load_tokenizer
from toolbox.serving.config import ServeConfig
from toolbox.serving.protocol import ApiError
from toolbox.serving.scheduler import BatchLoop, ContinuousBatcher, QueueFull
from toolbox.serving.sequence import Delta, SamplingParams, Sequence
from toolbox.serving.weights import load_weights, state_digest


@dataclass
class Running:
    """One request's choices and the queue their deltas arrive on."""

    sequences: list[Sequence]
    events: asyncio.Queue[tuple[int, Delta | BaseException]] = field(default_factory=asyncio.Queue)

    def cancel(self) -> None:
        for seq in self.sequences:
            seq.cancelled = True


class ServedModel:
    """What the routes need of any backend: the tokenizer side (prompts, chat template, detokenising), request
    ids, and turning one request into ``n`` `Sequence` s queued on ``batcher``.

    A backend sets ``tokenizer``, ``vocab_size``, ``context`` and ``batcher`` and implements `load_weights` and
    `digest`.
    """

    batcher: BatchLoop

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.model_id = config.model_id()
        self.tokenizer = load_tokenizer(config.model_dir(), config.trust_remote_code)
        self.vocab_size = 0
        self.context = 2048
        self.version = 0
        self._seeds = random.Random(config.seed)
        self._ids = itertools.count()
        self._token_texts: dict[int, str] = {}

    def start(self) -> None:
        self.batcher.start()

    def stop(self) -> None:
        self.batcher.stop()

    def request_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def encode(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a text prompt; a token-id prompt is checked against the vocabulary."""
        if isinstance(prompt, str):
            # A fast tokenizer's Rust backend directly: the same ids, without transformers' per-call Python.
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if backend is not None:
                return list(backend.encode(prompt, add_special_tokens=False).ids)
            return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ApiError(400, f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})",
                           "prompt")
        return list(prompt)

    def chat_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """The chat rendered by the tokenizer's chat template, with the generation prompt, as token ids."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(400, f"the tokenizer of {self.model_id!r} has no chat template; use /v1/completions",
                           "messages", "no_chat_template")
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.encode(str(text))

    def token_text(self, token: int) -> str:
        """One token's text on its own (cached: the stop-string test and log-prob responses ask often)."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = str(self.tokenizer.decode([token]))
        return text

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def start_choices(self, prompt_ids: list[int], params: SamplingParams, n: int, seed: int | None,
                      stream: bool = False) -> Running:
        """Queue ``n`` choices of one prompt; a 429 `ApiError` if the queue has no room for all of them.

        A streamed request hears of every token; any other only of each choice's end."""
        loop = asyncio.get_running_loop()
        running = Running([])
        base = self._seeds.randrange(2**62) if seed is None else seed
        for index in range(n):
            def listen(delta: Delta | BaseException, index: int = index) -> None:
                running.events.put_nowait((index, delta))  # on ``loop``: `toolbox.serving.sequence.publish`

            generator = torch.Generator().manual_seed(base + index)
            running.sequences.append(Sequence(prompt_ids, params, generator, listen, self._decode,
                                              self.tokenizer.eos_token_id, stream, loop, self.token_text))
        try:
            self.batcher.submit(running.sequences)
        except QueueFull as err:
            raise ApiError(429, f"the server is busy: {err}; retry later", None, "queue_full",
                           "rate_limit_error") from err
        return running

    def load_weights(self, payload: bytes) -> dict[str, int]:
        """Load a full safetensors state dict between steps; ``{"loaded": tensors, "version": new version}``."""
        raise NotImplementedError

    def digest(self) -> dict[str, Any]:
        """``{"sha256", "version"}`` of the served weights."""
        raise NotImplementedError


class ModelServer(ServedModel):
    """The ``hf`` backend: loads the model once and owns its `ContinuousBatcher` for the life of the app."""

    batcher: ContinuousBatcher

    def __init__(self, config: ServeConfig) -> None:
        super().__init__(config)
        model = load_causal_lm(config.model_dir(), config.dtype, config.trust_remote_code)
        self.model = model.to(config.device).eval()
        self.vocab_size = int(self.model.config.vocab_size)
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 2048)
        self.batcher = ContinuousBatcher(self.model, int(self.tokenizer.pad_token_id), config.max_batch_size,
                                         config.max_queue)

    def load_weights(self, payload: bytes) -> dict[str, int]:
        """Load a full safetensors state dict between decode steps; bump the version."""
        def load() -> int:
            return load_weights(self.model, payload)

        try:
            loaded = self.batcher.run_between_steps(load)
        except ValueError as err:
            raise ApiError(400, str(err), "body", "bad_weights") from err
        self.version += 1
        return {"loaded": loaded, "version": self.version}

    def digest(self) -> dict[str, Any]:
        return {"sha256": self.batcher.run_between_steps(lambda: state_digest(self.model)), "version": self.version}
