"""OpenAI response and stream-chunk bodies built from a request's deltas (completions and chat)."""

from __future__ import annotations

import time
from typing import Any

from toolbox.serving.sequence import Delta, Sequence
from toolbox.serving.server import ServedModel


def completion_logprobs(server: ServedModel, deltas: list[Delta], num_top: int | None) -> dict[str, Any] | None:
    """The completions ``logprobs`` object for ``deltas`` (None when not asked for)."""
    if num_top is None:
        return None
    tokens = [server.token_text(d.choice.token) for d in deltas]
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    tops = [{server.token_text(t): lp for t, lp in d.choice.top} for d in deltas] if num_top else None
    return {"tokens": tokens, "token_logprobs": [d.choice.logprob for d in deltas], "top_logprobs": tops,
            "text_offset": offsets}


def chat_logprobs(server: ServedModel, deltas: list[Delta], wanted: bool) -> dict[str, Any] | None:
    """The chat ``logprobs`` object (``content`` entries) for ``deltas`` (None when not asked for)."""
    if not wanted:
        return None

    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = server.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(d.choice.token, d.choice.logprob),
                         "top_logprobs": [entry(t, lp) for t, lp in d.choice.top]} for d in deltas]}


def choice_body(server: ServedModel, chat: bool, index: int, seq: Sequence, deltas: list[Delta],
                req: Any) -> dict[str, Any]:
    """One finished choice (non-streaming)."""
    body: dict[str, Any] = {"index": index, "finish_reason": seq.finish}
    if chat:
        body["message"] = {"role": "assistant", "content": seq.text}
        body["logprobs"] = chat_logprobs(server, deltas, req.logprobs)
    else:
        body["text"] = seq.text
        body["logprobs"] = completion_logprobs(server, deltas, req.logprobs)
    if req.return_token_ids:
        body["token_ids"] = [d.choice.token for d in deltas]
    return body


def chunk_choice(server: ServedModel, chat: bool, index: int, delta: Delta, req: Any, first: bool) -> dict[str, Any]:
    """One streamed delta of one choice."""
    body: dict[str, Any] = {"index": index, "finish_reason": delta.finish}
    if chat:
        body["delta"] = {"role": "assistant", "content": delta.text} if first else {"content": delta.text}
        body["logprobs"] = chat_logprobs(server, [delta], req.logprobs)
    else:
        body["text"] = delta.text
        body["logprobs"] = completion_logprobs(server, [delta], req.logprobs)
    if req.return_token_ids:
        body["token_ids"] = [delta.choice.token]
    return body


def envelope(server: ServedModel, request_id: str, chat: bool, stream: bool, choices: list[dict[str, Any]],
             usage: dict[str, int] | None = None) -> dict[str, Any]:
    """The object around the choices."""
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if stream and chat else "")
    body: dict[str, Any] = {"id": request_id, "object": kind, "created": int(time.time()), "model": server.model_id,
                            "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body
