"""The HTTP face of :class:`~autospec.serve.server.LLMServer`: an OpenAI-compatible FastAPI app.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream: true``
as server-sent events ending with ``data: [DONE]``), ``GET /v1/models``, ``GET /health``
(503 when the replica cannot serve), ``GET /metrics`` (Prometheus text: every replica's under
Ray Serve, ``?scope=replica``: this one's), ``GET /openapi.json`` and, with ``docs: true``,
``GET /docs``. With an API key configured every route but ``/health`` and ``/metrics`` needs
``Authorization: Bearer <key>`` (:mod:`autospec.serve.auth`).

Every completion answer names the speculator version that served it, in the header
``x-autospec-speculator`` and in the body's ``autospec`` object (for a stream: the header
and the last chunk before ``[DONE]``). When the live version was loaded into the running vLLM
engine while a request decoded, both drafted it: the body's ``drafted_by`` in the ``autospec``
object lists them in order, and a non-streamed answer's ``x-autospec-drafted-by`` header too.
Every HTTP answer of a replica (errors and ``/health`` included) names the replica in
``x-autospec-replica`` when :func:`make_app` is given one
(``id=<Serve replica id>; app=<application>; node=<Ray node id>; host=<hostname>``; see
:func:`autospec.serve.app.replica_identity`). Request headers: ``x-autospec-segment`` labels the
request for per-segment evaluation (default: the route, ``completions`` or ``chat``);
``x-autospec-log: off`` keeps the request's statistics but nothing the client wrote (no
text, ids, stop strings, seed or segment label; see :mod:`autospec.store.privacy`).

A client that disconnects before its answer abandons the request: a non-stream handler races
the decode against the disconnect (:func:`unless_disconnected`), a stream frees its request
when its response ends; see :meth:`~autospec.serve.server.LLMServer.abandon`.

Overload is a 503 with ``Retry-After`` before any byte of the answer, streamed or not: at
admission (the pending limit) and after the queue bound (``max_queue_wait_s``) — a stream's
``200`` is sent with its first decoded tokens, not while it waits in the replica's queue.

Bodies, headers and disconnects are handled by :mod:`autospec.serve.http_io`, which vLLM's
layer (:mod:`autospec.serve.vllm_http`) shares.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from autospec.engine.generate import GenerationResult
from autospec.serve.auth import ApiKeyAuth, configured_keys
from autospec.serve.detok import TextStream
from autospec.serve.errors import install_handlers
from autospec.serve.field_types import check_field_types
from autospec.serve.http_io import (
    VERSION_HEADER,
    AbandoningStream,
    ReplicaHeader,
    autospec_info,
    body_schema,
    client_gone,
    context,
    parse_replica,
    read_object,
    unless_disconnected,
    usage,
    validated,
    version_headers,
)
from autospec.serve.requests import PositionLogprobs, Prepared, RequestContext, Served
from autospec.serve.schemas import (
    AssistantMessage,
    AutospecInfo,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    ModelCard,
    ModelList,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from autospec.serve.server import LLMServer

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


#: ``parse_replica`` is :mod:`autospec.serve.http_io`'s, importable from here as before
__all__ = ["make_app", "parse_replica"]

def make_app(server: LLMServer, *, replica: str | None = None,
             metrics: Callable[[], Awaitable[bytes]] | None = None) -> FastAPI:
    """The FastAPI app serving ``server`` (Ray Serve wraps it; tests use it directly);
    ``replica``: the ``x-autospec-replica`` value of every answer (none if None);
    ``metrics``: what ``GET /metrics`` answers (default: this server's metrics only).
    ``GET /metrics?scope=replica`` always answers this server's."""
    docs = "/docs" if server.config.docs else None  # Swagger UI loads from a CDN: opt-in
    app = FastAPI(title="autospec", description="OpenAI-compatible speculative decoding",
                  version="1", docs_url=docs, redoc_url=None)
    install_handlers(app)
    keys = configured_keys(server.config.api_key, server.config.api_key_file)
    if keys is not None:
        app.add_middleware(ApiKeyAuth, keys=keys)
    if replica is not None:  # added last: outermost, so a 401 names the replica too
        app.add_middleware(ReplicaHeader, value=replica)

    @app.get("/health")
    async def health() -> JSONResponse:
        state = server.health()
        return JSONResponse(state, status_code=200 if state["ok"] else 503)

    @app.get("/metrics")
    async def metrics_route(scope: str = "deployment") -> Response:
        if metrics is None or scope == "replica":
            return Response(server.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
        return Response(await metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=server.model_name, created=server.created)])

    if server.api is None or not server.api.install_routes(app):  # vLLM's own on vLLM
        _completion_routes(app, server)
    return app


def _completion_routes(app: FastAPI, server: LLMServer) -> None:
    """autospec's own chat and completion routes (the native engine's)."""

    @app.post("/v1/completions", openapi_extra=body_schema(CompletionRequest),
              response_model=CompletionResponse)
    async def completions(request: Request) -> Response:
        req, ctx = await _read(request, server, CompletionRequest, "completions")
        prepared = await server.prepare_completion(req, ctx)
        if req.stream:
            return await _stream(request, server, prepared, chat=False,
                                     usage_chunk=req.include_usage)
        served = await unless_disconnected(request, server.generate(prepared))
        if served is None:
            return client_gone()
        body = completion_body(server, served, prepared)
        return JSONResponse(body.model_dump(), headers=version_headers(served))

    @app.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest),
              response_model=ChatCompletionResponse)
    async def chat_completions(request: Request) -> Response:
        req, ctx = await _read(request, server, ChatCompletionRequest, "chat")
        prepared = await server.prepare_chat(req, ctx)
        if req.stream:
            return await _stream(request, server, prepared, chat=True,
                                     usage_chunk=req.include_usage)
        served = await unless_disconnected(request, server.generate(prepared))
        if served is None:
            return client_gone()
        body = chat_body(server, served, prepared)
        return JSONResponse(body.model_dump(), headers=version_headers(served))


async def _read(request: Request, server: LLMServer, model: type[M],
                route: str) -> tuple[M, RequestContext]:
    """The body as ``model`` and the request's context: its segment resolved once, from
    the headers and the body (the serve config's rules, :mod:`autospec.serve.segments`)."""
    data = await read_object(request, server.config.max_body_bytes)
    check_field_types(data, route)  # as on vLLM: its models read "0.5" as a number
    return validated(data, model), context(request, route, data, server.config.segments)


def _text(server: LLMServer, result: GenerationResult) -> str:
    if result.text is not None:
        return result.text
    return server.target.decode(result.token_ids)


def _choice_logprobs(served: Served, index: int) -> list[PositionLogprobs] | None:
    return None if served.logprobs is None else served.logprobs[index]


def completion_body(server: LLMServer, served: Served, prepared: Prepared) -> CompletionResponse:
    choices = [CompletionChoice(index=i, text=_text(server, result),
                                logprobs=completion_logprobs(server, _choice_logprobs(served, i)),
                                finish_reason=result.finish_reason)
               for i, result in enumerate(served.choices)]
    return CompletionResponse(
        id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()), model=server.model_name,
        choices=choices, usage=usage(served, prepared), autospec=autospec_info(served))


def chat_body(server: LLMServer, served: Served, prepared: Prepared) -> ChatCompletionResponse:
    choices = [ChatChoice(index=i, message=AssistantMessage(content=_text(server, result)),
                          logprobs=chat_logprobs(server, _choice_logprobs(served, i)),
                          finish_reason=result.finish_reason)
               for i, result in enumerate(served.choices)]
    return ChatCompletionResponse(
        id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=server.model_name,
        choices=choices, usage=usage(served, prepared), autospec=autospec_info(served))


def completion_logprobs(server: LLMServer,
                        tokens: list[PositionLogprobs] | None) -> CompletionLogprobs | None:
    """OpenAI's completions form: token strings, their log-probabilities, the alternatives
    by string and each token's character offset in the choice's text."""
    if tokens is None:
        return None
    piece = _piece(server)
    strings = [piece(t.token_id) for t in tokens]
    offsets = [sum(len(s) for s in strings[:i]) for i in range(len(strings))]
    return CompletionLogprobs(
        tokens=strings, token_logprobs=[t.logprob for t in tokens],
        top_logprobs=[{piece(i): lp for i, lp in t.top} for t in tokens], text_offset=offsets)


def chat_logprobs(server: LLMServer, tokens: list[PositionLogprobs] | None) -> ChatLogprobs | None:
    """OpenAI's chat form: each token with its UTF-8 bytes and its alternatives."""
    if tokens is None:
        return None
    piece = _piece(server)

    def top(token_id: int, logprob: float) -> TopLogprob:
        text = piece(token_id)
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

    return ChatLogprobs(content=[
        TokenLogprob(**top(t.token_id, t.logprob).model_dump(),
                     top_logprobs=[top(i, lp) for i, lp in t.top])
        for t in tokens])


def _piece(server: LLMServer) -> Callable[[int], str]:
    """A token id's text as the tokenizer decodes it alone."""
    tokenizer = server.target.tokenizer
    return lambda token_id: tokenizer.decode([token_id])


# -- streaming ----------------------------------------------------------------------------


async def _stream(request: Request, server: LLMServer, prepared: Prepared, *,
                  chat: bool, usage_chunk: bool) -> Response:
    """An SSE answer; the last chunk carries ``usage`` when ``usage_chunk``
    (``stream_options.include_usage``), and the ``autospec`` object always."""
    steps = server.stream(prepared)  # admits now: an overload is a 503 before any byte
    # and waits for the first tokens before the 200: a request shed in the queue is a 503 too
    first = await unless_disconnected(request, anext(steps, None))
    if first is None:  # the client left while it waited (or it was abandoned)
        steps.abandon()
        return client_gone()
    events = _sse(server, prepared, _after(first, steps), chat=chat, usage_chunk=usage_chunk)
    return AbandoningStream(steps, events, media_type="text/event-stream",
                            headers={VERSION_HEADER: prepared.version.name,
                                     "Cache-Control": "no-cache"})


async def _after(first: list[int] | Served,
                 rest: AsyncIterable[list[int] | Served]) -> AsyncIterator[list[int] | Served]:
    """``first``, then ``rest``."""
    yield first
    async for item in rest:
        yield item


async def _sse(server: LLMServer, prepared: Prepared, steps: AsyncIterable[list[int] | Served],
               *, chat: bool, usage_chunk: bool) -> AsyncIterator[str]:
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    chunk = _ChunkMaker(rid, server.model_name, chat)
    text = TextStream(server.target.tokenizer, prepared.params.stop)
    if chat:
        yield chunk.event(DeltaMessage(role="assistant", content=""))
    try:
        async for item in steps:
            if isinstance(item, Served):
                rest = text.finish(_text(server, item.result))
                if rest:
                    yield chunk.event(DeltaMessage(content=rest) if chat else rest)
                info = autospec_info(item)
                yield chunk.event(DeltaMessage() if chat else "", item.result.finish_reason,
                                  info=None if usage_chunk else info)
                if usage_chunk:  # as OpenAI and vLLM: a last chunk of no choices, the usage
                    yield chunk.event(None, info=info, usage=usage(item, prepared))
            else:
                delta = text.push(item)
                if delta:
                    yield chunk.event(DeltaMessage(content=delta) if chat else delta)
    except Exception as exc:  # after the 200 is sent an error can only be an event
        yield _sse_line({"error": {"message": f"generation failed: {type(exc).__name__}",
                                   "type": "internal_error", "param": None, "code": None}})
    yield "data: [DONE]\n\n"


class _ChunkMaker:
    def __init__(self, rid: str, model: str, chat: bool) -> None:
        self.rid, self.model, self.chat = rid, model, chat
        self.created = int(time.time())

    def event(self, delta: DeltaMessage | str | None, finish_reason: str | None = None, *,
              info: AutospecInfo | None = None, usage: Usage | None = None) -> str:
        """A chunk of one choice carrying ``delta``; with ``delta`` None, one of no choices
        (the usage chunk)."""
        if self.chat:
            assert delta is None or isinstance(delta, DeltaMessage)
            body: BaseModel = ChatCompletionChunk(
                id=self.rid, created=self.created, model=self.model, usage=usage,
                choices=[] if delta is None else
                [ChatChunkChoice(delta=delta, finish_reason=finish_reason)], autospec=info)
        else:
            assert delta is None or isinstance(delta, str)
            body = CompletionResponse(
                id=self.rid, created=self.created, model=self.model, usage=usage,
                choices=[] if delta is None else
                [CompletionChoice(text=delta, finish_reason=finish_reason)], autospec=info)
        data = body.model_dump()
        for key in ("usage", "autospec"):  # only on the last chunk
            if data[key] is None:
                del data[key]
        return _sse_line(data)


def _sse_line(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
