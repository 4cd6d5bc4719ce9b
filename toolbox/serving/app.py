"""The FastAPI app: OpenAI routes (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``), the toolbox
weight routes, API-key and admin-token checks, and every error in the OpenAI error shape.

Status codes: 400 a bad value, 401 a missing or wrong key, 404 an unknown model or route (or the weight route
while no admin token is configured), 422 a malformed body, 429 a full queue, 500 a failure of the model. A
traceback goes to the server log, never to the client.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from toolbox.serving.protocol import ApiError, ChatRequest, CompletionRequest, check_sampling
from toolbox.serving.responses import choice_body, chunk_choice, envelope
from toolbox.serving.sequence import SamplingParams
from toolbox.serving.server import Running, ServedModel

log = logging.getLogger(__name__)

# Seconds an idle keep-alive connection stays open (uvicorn's ``timeout_keep_alive``; its default is 5). Longer than
# the idle expiry of the clients' connection pools (httpx, which the openai package uses: 5 s), so the client always
# drops an idle connection first: with both at 5 s a request sent just as the server closes the connection is reset.
KEEP_ALIVE_S = 75


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else None


def _check_token(request: Request, expected: str, what: str) -> None:
    sent = _bearer(request)
    if sent is None or not secrets.compare_digest(sent.encode(), expected.encode()):
        raise ApiError(401, f"{'a wrong' if sent else 'no'} {what} was sent (Authorization: Bearer ...)", None,
                       "invalid_api_key", "authentication_error")


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def malformed(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in err.errors())
        return JSONResponse(ApiError(422, f"malformed request body: {message}", where or None).body(), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = f"no route {request.method} {request.url.path}" if err.status_code in (404, 405) else str(err.detail)
        return JSONResponse(ApiError(err.status_code, message).body(), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def failure(_: Request, err: Exception) -> JSONResponse:
        log.exception("toolbox serve: request failed")
        return JSONResponse(ApiError(500, f"the server failed: {type(err).__name__}: {err}", None, None,
                                     "server_error").body(), 500)


async def _finished(running: Running) -> None:
    """Wait until every choice has finished (a non-streamed request hears only of each choice's end)."""
    left = len(running.sequences)
    try:
        while left:
            _, delta = await running.events.get()
            if isinstance(delta, BaseException):
                raise ApiError(500, f"generation failed: {delta!r}", None, None, "server_error")
            left -= delta.finish is not None
    finally:
        running.cancel()  # a disconnected client's choices stop decoding


async def _events(server: ServedModel, running: Running, req: Any, chat: bool, rid: str) -> AsyncIterator[str]:
    """Server-sent events: one chunk per delta, then ``[DONE]``; the chunks that are ready go out in one write."""
    left, started = len(running.sequences), set()
    try:
        while left:
            ready = [await running.events.get()]
            while not running.events.empty():
                ready.append(running.events.get_nowait())
            chunks = []
            for index, delta in ready:
                if isinstance(delta, BaseException):
                    chunks.append(f"data: {json.dumps(ApiError(500, f'generation failed: {delta!r}').body())}\n\n")
                    yield "".join(chunks)
                    return
                choice = chunk_choice(server, chat, index, delta, req, first=index not in started)
                started.add(index)
                left -= delta.finish is not None
                chunks.append(f"data: {json.dumps(envelope(server, rid, chat, True, [choice]))}\n\n")
            if not left:
                chunks.append("data: [DONE]\n\n")
            yield "".join(chunks)
    finally:
        running.cancel()


async def _generate(server: ServedModel, req: CompletionRequest | ChatRequest, prompt_ids: list[int],
                    chat: bool) -> Response:
    if req.model != server.model_id:
        raise ApiError(404, f"the model {req.model!r} does not exist; this server serves {server.model_id!r}",
                       "model", "model_not_found")
    req.warn_ignored()
    num_top = (req.top_logprobs or 0) if isinstance(req, ChatRequest) else (req.logprobs or 0)
    max_tokens = check_sampling(req, len(prompt_ids), server.context, num_top)
    params = SamplingParams(max_tokens, req.temperature, req.top_p, req.stops(), num_top, req.ignore_eos,
                            max(req.top_k, 0))
    running = server.start_choices(prompt_ids, params, req.n, req.seed, req.stream)
    rid = server.request_id("chatcmpl" if chat else "cmpl")
    if req.stream:
        return StreamingResponse(_events(server, running, req, chat, rid), media_type="text/event-stream")
    await _finished(running)
    choices = [choice_body(server, chat, i, seq, req) for i, seq in enumerate(running.sequences)]
    generated = sum(len(seq.token_ids) for seq in running.sequences)
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": generated,
             "total_tokens": len(prompt_ids) + generated}
    # A Response, not a dict: FastAPI would walk the body with jsonable_encoder first.
    return Response(json.dumps(envelope(server, rid, chat, False, choices, usage)), media_type="application/json")


def create_app(server: ServedModel, api_key: str | None = None, admin_token: str | None = None) -> FastAPI:
    """The app serving ``server``; ``api_key`` guards every route, ``admin_token`` enables weight updates."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.start()
        yield
        server.stop()

    async def authorized(request: Request) -> None:
        # The weight route's Authorization header carries the admin token instead of the API key.
        if api_key and not (request.method == "POST" and request.url.path == "/v1/toolbox/weights"):
            _check_token(request, api_key, "API key")

    app = FastAPI(title="toolbox serve", lifespan=lifespan, dependencies=[Depends(authorized)])
    _install_error_handlers(app)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": server.model_id, "object": "model", "created": 0,
                                            "owned_by": "toolbox", "max_model_len": server.context}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Response:
        if req.echo:
            raise ApiError(400, "echo is not supported", "echo")
        return await _generate(server, req, server.encode(req.prompt), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest) -> Response:
        return await _generate(server, req, server.chat_prompt([m.model_dump() for m in req.messages]), chat=True)

    _add_weight_routes(app, server, admin_token)
    return app


def _add_weight_routes(app: FastAPI, server: ServedModel, admin_token: str | None) -> None:
    @app.get("/v1/toolbox/info")
    async def info() -> dict[str, Any]:
        return {"model": server.model_id, "weight_update": bool(admin_token), "version": server.version}

    @app.get("/v1/toolbox/weights/digest")
    async def digest() -> dict[str, Any]:
        return await run_in_threadpool(server.digest)

    @app.post("/v1/toolbox/weights")
    async def weights(request: Request) -> dict[str, int]:
        if not admin_token:
            raise ApiError(404, "weight updates are disabled: start the server with its admin token env var set",
                           None, "weight_update_disabled")
        _check_token(request, admin_token, "admin token")
        return await run_in_threadpool(server.load_weights, await request.body())
