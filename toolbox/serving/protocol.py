"""Request bodies of the OpenAI-compatible endpoints, and the `ApiError` every failure becomes.

Pydantic checks types (a wrong type or a missing field is a 422); `check_sampling` checks values against the
served model (a value out of range is a 400), naming the parameter. Fields OpenAI defines but this server does
not implement (``presence_penalty``, ``best_of``, ...) are accepted and ignored with a warning, as vLLM does, so
eval harnesses that send them still work.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

MAX_N = 64
MAX_TOP_LOGPROBS = 20


class ApiError(Exception):
    """An error the client sees as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class _Sampling(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(description="The served model's id (see /v1/models).")
    n: int = Field(1, description="Choices per request.")
    max_tokens: int | None = Field(None, description="Most tokens to generate per choice; None: up to the context.")
    temperature: float = Field(1.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, description="Nucleus sampling mass.")
    top_k: int = Field(-1, description="vLLM extension: sample among the k most likely tokens; -1 or 0: all.")
    stop: str | list[str] | None = Field(None, description="Strings that end a choice (not included in its text).")
    seed: int | None = Field(None, description="Seed of the choice's sampler (choice i uses seed + i).")
    stream: bool = Field(False, description="Send server-sent events as tokens are generated.")
    ignore_eos: bool = Field(False, description="vLLM extension: do not stop at the EOS token.")
    return_token_ids: bool = Field(False, description="vLLM/SGLang extension: each choice carries `token_ids`.")

    def warn_ignored(self) -> None:
        if self.model_extra:
            log.warning("toolbox serve: ignoring unsupported request fields %s", sorted(self.model_extra))

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class CompletionRequest(_Sampling):
    """Body of ``POST /v1/completions``."""

    prompt: str | list[int] = Field(description="Text, or token ids.")
    logprobs: int | None = Field(None, description="Report the sampled token's log-prob and this many top ones.")
    echo: bool = Field(False, description="Not supported; must be false.")


class ChatMessage(BaseModel):
    """One message of a chat."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str


class ChatRequest(_Sampling):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(description="The conversation; the tokenizer's chat template renders it.")
    logprobs: bool = Field(False, description="Report each sampled token's log-prob.")
    top_logprobs: int | None = Field(None, description="With logprobs: this many most likely tokens per position.")
    max_completion_tokens: int | None = Field(None, description="Newer name of max_tokens; wins when both are set.")


def check_sampling(req: _Sampling, prompt_len: int, context: int, num_top: int) -> int:
    """Raise a 400 `ApiError` naming the first bad value; return the ``max_tokens`` to use."""
    checks = [
        (1 <= req.n <= MAX_N, "n", f"n must be in [1, {MAX_N}], got {req.n}"),
        (0.0 <= req.temperature <= 100.0, "temperature", f"temperature must be in [0, 100], got {req.temperature}"),
        (0.0 < req.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {req.top_p}"),
        (req.top_k >= -1, "top_k", f"top_k must be -1, 0 (all tokens) or a positive count, got {req.top_k}"),
        (all(req.stops()) and len(req.stops()) <= 4, "stop", "stop must be up to 4 non-empty strings"),
        (0 <= num_top <= MAX_TOP_LOGPROBS, "logprobs", f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {num_top}"),
        (prompt_len > 0, "prompt", "the prompt is empty"),
        (prompt_len < context, "prompt", f"the prompt has {prompt_len} tokens; the model's context is {context}"),
    ]
    for ok, param, message in checks:
        if not ok:
            raise ApiError(400, message, param)
    room = context - prompt_len
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
    if max_tokens is None:
        return room
    if not 1 <= max_tokens <= room:
        raise ApiError(400, f"max_tokens must be in [1, {room}] (context {context} - prompt {prompt_len} tokens), "
                       f"got {max_tokens}", "max_tokens")
    return max_tokens
