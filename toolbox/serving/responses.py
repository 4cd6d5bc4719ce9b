"""OpenAI response and stream-chunk bodies built from a request's deltas (completions and chat)."""

from __future__ import annotations

import itertools
import time
from typing import Any

from toolbox.serving.sampling import Choice
from toolbox.serving.sequence import Delta, Sequence
from toolbox.serving.server import ServedModel


def completion_logprobs(server: ServedModel, choices: list[Choice], num_top: int | None) -> dict[str, Any] | None:
    """The completions ``logprobs`` object for ``choices`` (None when not asked for)."""
    if num_top is None:
        return None
    tokens = [server.token_text(c.token) for c in choices]
    offsets = list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0)) if tokens else []
    tops = [{server.token_text(t): lp for t, lp in c.top} for c in choices] if num_top else None
    return {"tokens": tokens, "token_logprobs": [c.logprob for c in choices], "top_logprobs": tops,
            "text_offset": offsets}


def chat_logprobs(server: ServedModel, choices: list[Choice], wanted: bool) -> dict[str, Any] | None:
    """The chat ``logprobs`` object (``content`` entries) for ``choices`` (None when not asked for)."""
    if not wanted:
        return None

    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = server.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(c.token, c.logprob), "top_logprobs": [entry(t, lp) for t, lp in c.top]}
                        for c in choices]}


def choice_body(server: ServedModel, chat: bool, index: int, seq: Sequence, req: Any) -> dict[str, Any]:
    """One finished choice (non-streaming)."""
    body: dict[str, Any] = {"index": index, "finish_reason": seq.finish}
    if chat:
        body["message"] = {"role": "assistant", "content": seq.text}
        body["logprobs"] = chat_logprobs(server, seq.choices(), req.logprobs) if req.logprobs else None
    else:
        body["text"] = seq.text
        body["logprobs"] = completion_logprobs(server, seq.choices(), req.logprobs) if req.logprobs is not None \
            else None
    if req.return_token_ids:
        body["token_ids"] = list(seq.token_ids)
    return body


def chunk_choice(server: ServedModel, chat: bool, index: int, delta: Delta, req: Any, first: bool) -> dict[str, Any]:
    """One streamed delta of one choice."""
    body: dict[str, Any] = {"index": index, "finish_reason": delta.finish}
    if chat:
        body["delta"] = {"role": "assistant", "content": delta.text} if first else {"content": delta.text}
        body["logprobs"] = chat_logprobs(server, [delta.choice], req.logprobs)
    else:
        body["text"] = delta.text
        body["logprobs"] = completion_logprobs(server, [delta.choice], req.logprobs)
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
