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

Bodies are read here, not by FastAPI, so that every bad input gets a small 4xx in the OpenAI
error shape: an oversized body (413), invalid UTF-8, malformed JSON, NaN/Infinity, a
non-object, a lone surrogate, or any field pydantic rejects (400).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from autospec.engine.generate import GenerationResult
from autospec.engine.stats import RequestStats
from autospec.serve.auth import ApiKeyAuth, configured_keys
from autospec.serve.detok import TextStream
from autospec.serve.errors import APIError, install_handlers, validation_error
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
from autospec.serve.server import (
    LLMServer,
    PositionLogprobs,
    Prepared,
    RequestContext,
    Served,
    Streamed,
)

VERSION_HEADER = "x-autospec-speculator"
DRAFTED_BY_HEADER = "x-autospec-drafted-by"
SEGMENT_HEADER = "x-autospec-segment"
LOG_HEADER = "x-autospec-log"
REPLICA_HEADER = "x-autospec-replica"
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$")
_OFF = {"off", "0", "false", "no"}

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


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

    if not server.install_routes(app):  # vLLM's OpenAI layer on a vLLM replica, else this
        _completion_routes(app, server)
    return app


def _completion_routes(app: FastAPI, server: LLMServer) -> None:
    """autospec's own chat and completion routes (the native engine's)."""

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest),
              response_model=CompletionResponse)
    async def completions(request: Request) -> Response:
        req = await read_json(request, CompletionRequest, server.config.max_body_bytes)
        prepared = await server.prepare_completion(req, context(request, "completions"))
        if req.stream:
            return _stream(server, prepared, chat=False)
        served = await unless_disconnected(request, server.generate(prepared))
        if served is None:
            return _client_gone()
        body = completion_body(server, served, prepared)
        return JSONResponse(body.model_dump(), headers=version_headers(served))

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest),
              response_model=ChatCompletionResponse)
    async def chat_completions(request: Request) -> Response:
        req = await read_json(request, ChatCompletionRequest, server.config.max_body_bytes)
        prepared = await server.prepare_chat(req, context(request, "chat"))
        if req.stream:
            return _stream(server, prepared, chat=True)
        served = await unless_disconnected(request, server.generate(prepared))
        if served is None:
            return _client_gone()
        body = chat_body(server, served, prepared)
        return JSONResponse(body.model_dump(), headers=version_headers(served))


class ReplicaHeader:
    """ASGI middleware: adds ``x-autospec-replica: <value>`` to every HTTP answer (streams
    included: the header goes out with the response start)."""

    def __init__(self, app: Any, value: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode("latin-1"), value.encode("latin-1", "replace"))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_named(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


def parse_replica(value: str | None) -> dict[str, str]:
    """The fields of an ``x-autospec-replica`` value (``{}`` for None or empty)."""
    fields = (part.strip().partition("=") for part in (value or "").split(";"))
    return {key: val for key, sep, val in fields if sep}


# -- abandoned requests -------------------------------------------------------------------


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None after cancelling it if the client disconnects first (as
    vLLM's ``with_cancellation``). The body must have been read: what ``receive`` gives next
    is the disconnect."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is itself cancelled (Ray Serve: client gone)
        for t in (task, watch):
            if not t.done():
                t.cancel()
    if not task.done() or task.cancelled():
        return None
    return task.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _client_gone() -> Response:
    # nobody reads this answer; 499 ("client closed request") names it in access logs
    return Response(status_code=499)


class _AbandoningStream(StreamingResponse):
    """A stream that frees its request when the response ends for any reason, including a
    client that left before the first chunk (the body iterator never started)."""

    def __init__(self, streamed: Streamed, content: AsyncIterator[str],
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.streamed = streamed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.streamed.abandon()  # no effect once it has finished


# -- reading requests ---------------------------------------------------------------------


def context(request: Request, route: str) -> RequestContext:
    """Segment and logging choice from the request headers."""
    segment = request.headers.get(SEGMENT_HEADER, route).strip()
    if not _SEGMENT.match(segment):
        raise APIError(400, f"{SEGMENT_HEADER} must be 1-64 letters, digits or ._:/- "
                       f"starting with a letter or digit", param=SEGMENT_HEADER,
                       code="invalid_header")
    log_text = request.headers.get(LOG_HEADER, "on").strip().lower() not in _OFF
    return RequestContext(route=route, segment=segment, log_text=log_text)


async def read_json(request: Request, model: type[M], limit: int) -> M:
    """The body as ``model``, or an :class:`APIError` saying what is wrong with it."""
    data = await read_object(request, limit)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


async def read_object(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, or an :class:`APIError` saying what is wrong with it."""
    raw = await _read_body(request, limit)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"request body is not valid UTF-8 ({exc.reason} at byte "
                       f"{exc.start})", code="invalid_encoding") from None
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    _check_unicode(data)
    return data


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise APIError(400, "invalid Content-Length header", code="invalid_header")
        if int(declared) > limit:
            raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body larger than {limit} bytes", code="body_too_large")


def _no_constants(name: str) -> Any:
    raise APIError(400, f"request body is not valid JSON: {name} is not a number",
                   code="invalid_json")


def _check_unicode(value: Any) -> None:
    """Refuse strings a tokenizer cannot encode (lone surrogates from ``\\ud800`` escapes)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise APIError(400, "request contains an unpaired surrogate (invalid Unicode)",
                               code="invalid_encoding") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}},
            "x-autospec-defs": sorted(defs)}


# -- responses ----------------------------------------------------------------------------


def version_headers(served: Served) -> dict[str, str]:
    """The version header, and every drafting version's when a swap happened mid-request."""
    headers = {VERSION_HEADER: served.version.name}
    if served.drafted_by:
        headers[DRAFTED_BY_HEADER] = ",".join(served.drafted_by)
    return headers


def _usage(served: Served, prepared: Prepared) -> Usage:
    n_out = sum(len(result.token_ids) for result in served.choices)
    return Usage(prompt_tokens=len(prepared.prompt_ids), completion_tokens=n_out,
                 total_tokens=len(prepared.prompt_ids) + n_out)


def autospec_info(served: Served) -> AutospecInfo:
    """The ``autospec`` object: over all choices when there are several."""
    stats = served.result.stats if not served.extra else \
        RequestStats.merged([result.stats for result in served.choices])
    return AutospecInfo.from_stats(served.version.name, stats, served.drafted_by)


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
        choices=choices, usage=_usage(served, prepared), autospec=autospec_info(served))


def chat_body(server: LLMServer, served: Served, prepared: Prepared) -> ChatCompletionResponse:
    choices = [ChatChoice(index=i, message=AssistantMessage(content=_text(server, result)),
                          logprobs=chat_logprobs(server, _choice_logprobs(served, i)),
                          finish_reason=result.finish_reason)
               for i, result in enumerate(served.choices)]
    return ChatCompletionResponse(
        id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=server.model_name,
        choices=choices, usage=_usage(served, prepared), autospec=autospec_info(served))


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


def _stream(server: LLMServer, prepared: Prepared, *, chat: bool) -> StreamingResponse:
    steps = server.stream(prepared)  # admits now: an overload is a 503 before any byte
    events = _sse(server, prepared, steps, chat=chat)
    return _AbandoningStream(steps, events, media_type="text/event-stream",
                             headers={VERSION_HEADER: prepared.version.name,
                                      "Cache-Control": "no-cache"})


async def _sse(server: LLMServer, prepared: Prepared, steps: AsyncIterable[list[int] | Served],
               *, chat: bool) -> AsyncIterator[str]:
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
                usage = _usage(item, prepared)
                yield chunk.event(DeltaMessage() if chat else "", item.result.finish_reason,
                                  info=autospec_info(item), usage=usage)
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

    def event(self, delta: DeltaMessage | str, finish_reason: str | None = None, *,
              info: AutospecInfo | None = None, usage: Usage | None = None) -> str:
        if self.chat:
            assert isinstance(delta, DeltaMessage)
            body: BaseModel = ChatCompletionChunk(
                id=self.rid, created=self.created, model=self.model, usage=usage,
                choices=[ChatChunkChoice(delta=delta, finish_reason=finish_reason)],
                autospec=info)
        else:
            assert isinstance(delta, str)
            body = CompletionResponse(
                id=self.rid, created=self.created, model=self.model, usage=usage,
                choices=[CompletionChoice(text=delta, finish_reason=finish_reason)],
                autospec=info)
        data = body.model_dump()
        for key in ("usage", "autospec"):  # only on the last chunk
            if data[key] is None:
                del data[key]
        return _sse_line(data)


def _sse_line(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
