"""Chat and completion routes of a vLLM replica: vLLM's OpenAI layer with autospec's hooks.

``POST /v1/chat/completions`` and ``POST /v1/completions`` parse the body with vLLM's own
request models and answer with vLLM's ``OpenAIServingChat`` / ``OpenAIServingCompletion``
(:mod:`autospec.serve.vllm_openai`): every field vLLM's server takes, its answers and its
errors. Around them, autospec's own:

- the body is read as everywhere (:func:`autospec.serve.http_io.read_object`: size, UTF-8,
  JSON, NaN, surrogates), and its scalar fields' JSON types checked as on the native engine
  (:mod:`autospec.serve.field_types`: vLLM's models read ``"0.5"`` as a number and ``"yes"``
  as true); what vLLM's models refuse is answered by vLLM's own handler, and
  a key vLLM's types do not declare, at any level (``temprature``, ``messages.0.nmae``,
  ``tools.0.function.descripton``), is a 400 naming its path — vLLM's server would ignore
  it; here no field is ignored silently (:mod:`autospec.serve.vllm_fields`);
- ``use_beam_search`` is served as vLLM serves it but not logged: vLLM's beam search decodes
  one token per engine call (``beam_width`` calls a step), so no speculator drafts and its
  one-token calls are no traffic to learn from; the answer names the version it was bound
  to and carries no ``autospec`` object. Every step goes to the engine it was bound to,
  which a swap does not close before the answer ends (streamed too: a stream's steps are
  called as it is read);
- admission: a request beyond ``max_pending_requests`` is a 503 before vLLM sees it, and the
  request is bound to the live version until its answer ends;
- the answer names the version in ``x-autospec-speculator`` (and ``x-autospec-drafted-by``
  after an in-place swap mid-request) and carries the ``autospec`` object: in the body, or in
  the last chunk before ``data: [DONE]`` of a stream;
- a client gone before its answer aborts the request in vLLM; it is not logged.

:class:`VllmLayer` is what a vLLM replica's server holds for all this (``server.api``): it
installs these routes, admits through the server, builds vLLM's handlers over the engine
serving now and writes the traffic row of each request vLLM's layer decoded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from autospec.serve.config import ServeConfig
from autospec.serve.decode import Replica as Host
from autospec.serve.errors import APIError
from autospec.serve.field_types import check_field_types
from autospec.serve.http_io import (
    VERSION_HEADER,
    autospec_info,
    context,
    read_object,
    unless_disconnected,
    version_headers,
)
from autospec.serve.requests import Prepared, RequestContext, Served
from autospec.serve.schemas import MAX_CHOICES
from autospec.serve.versions import VersionManager
from autospec.serve.vllm_decode import vllm_served
from autospec.serve.vllm_fields import is_content_part_key, unknown_keys
from autospec.serve.vllm_openai import (
    Binding,
    Replica,
    VllmApi,
    autospec_params,
    chat_content_format,
    unreplayable,
    vllm_settings,
)
from autospec.serve.vllm_versions import vllm_engine


class Server(Host, Protocol):
    """What :class:`VllmLayer` needs of the server that holds it."""

    versions: VersionManager
    config: ServeConfig
    model_name: str
    target: Any


class VllmLayer:
    """vLLM's OpenAI layer over a replica's engines, held by its server (``server.api``):
    admission and the traffic row through the server, vLLM's handlers for the engine serving
    now. ``api_args``: vLLM's server arguments (:func:`api_args`)."""

    def __init__(self, server: Server, api_args: argparse.Namespace) -> None:
        self.server, self.api_args = server, api_args
        self._api: VllmApi | None = None
        self._api_engine: Any = None  # the engine whose renderer vLLM's handlers hold
        self._api_lock = asyncio.Lock()

    @property
    def versions(self) -> VersionManager:
        return self.server.versions

    @property
    def metrics(self) -> Any:
        return self.server.metrics

    @property
    def config(self) -> ServeConfig:
        return self.server.config

    @property
    def model_name(self) -> str:
        return self.server.model_name

    def install_routes(self, app: FastAPI) -> bool:
        """vLLM's layer serves chat and completions (:func:`add_routes`)."""
        add_routes(app, self)
        return True

    async def openai_api(self) -> VllmApi:
        """vLLM's chat and completion handlers over the replica's engines, built on the
        loop that serves them, and again for each new engine (vLLM's handlers keep the
        renderer of the engine they were built over, which goes when that engine does)."""
        async with self._api_lock:
            engine = self.versions.current.engine
            if self._api is None or self._api_engine is not engine:
                self._api = await VllmApi.build(self, self.api_args)
                self._api_engine = engine
        return self._api

    def bind(self, ctx: RequestContext) -> Binding:
        """Admit a request (an overload raises :class:`~autospec.serve.requests.Overloaded`)
        and bind it to the live version; it is in flight, and its engine kept up however
        many times it calls it (beam search: once a step), until :meth:`release`."""
        job = self.server.admit()
        self.server.begin(job)  # vLLM batches every admitted request: no queue of autospec's
        version = self.versions.for_segment(ctx.segment)
        vllm_engine(version.engine).hold()  # a swap's retire waits for release()
        return Binding(ctx, job, version)

    def release(self, binding: Binding) -> None:
        """The request's answer has ended (idempotent)."""
        if not binding.released:
            binding.released = True
            vllm_engine(binding.version.engine).unhold()
            self.server.end(binding.job)

    def report_vllm(self, binding: Binding, output: Any, sampling_params: Any, ttft_s: float,
                    first: int) -> Served:
        """Record a request vLLM's layer decoded: one traffic row per choice, with every
        sampling setting it was decoded under (see :mod:`autospec.serve.vllm_openai`)."""
        ids = list(output.prompt_token_ids or [])
        text = output.prompt if output.prompt is not None else \
            self.server.target.tokenizer.decode(ids)
        p = Prepared(binding.ctx, ids, text, autospec_params(sampling_params), binding.version,
                     n=int(sampling_params.n or 1),
                     vllm={"settings": vllm_settings(sampling_params),
                           "unreplayable": unreplayable(sampling_params),
                           "logprobs": sampling_params.logprobs})
        served = replace(vllm_served(p, output, ttft_s, first),
                         concurrency=self.server.concurrency(binding.job),
                         in_flight=binding.job.in_flight)
        self.server.report(p, served)
        return served


def add_routes(app: FastAPI, server: Replica) -> None:
    """The two routes, served by vLLM's handlers over ``server``'s engines."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    app.state.args = server.api_args  # what vLLM's error handlers read
    _route(app, server, "/v1/completions", "completions", CompletionRequest,
           lambda api: api.completion.create_completion)
    _route(app, server, "/v1/chat/completions", "chat", ChatCompletionRequest,
           lambda api: api.chat.create_chat_completion)


def _route(app: FastAPI, server: Replica, path: str, route: str, model: type[BaseModel],
           handler: Callable[[Any], Callable[..., Any]]) -> None:
    """``POST path``: the body as vLLM's ``model``, answered by ``handler(vLLM's API)``."""

    @app.post(path)
    async def answer(request: Request) -> Response:
        data = await read_object(request, server.config.max_body_bytes)
        try:  # vLLM's models would read "0.5" as 0.5, "yes" as true
            check_field_types(data, route)
        except APIError as exc:  # in vLLM's error shape, as its models' refusals are
            return _error(exc.message, param=exc.param)
        api = None  # vLLM's handlers, built at the first request that gets that far
        if route == "chat" and any(map(is_content_part_key, unknown_keys(data, model))):
            api = await server.openai_api()  # its template decides whether they are read
        req = parse(data, model, content_format=None if api is None else
                    lambda req: chat_content_format(api.chat, req))
        if isinstance(req, ValidationError):
            return await _invalid(request, req)
        if isinstance(req, Exception):  # a vLLM validator's own error: its 400, not a 500
            return _error(req)
        refused = limit_tokens(req, server.config, route)
        if refused is not None:
            return refused
        ctx = context(request, route, data, server.config.segments)  # the segment, once
        api = api or await server.openai_api()
        return await serve(server, request, ctx, handler(api), req)


def limit_tokens(req: Any, config: ServeConfig, route: str) -> Response | None:
    """The deployment's bounds on tokens to generate, as on the native engine: a value above
    ``max_tokens_limit`` is a 400 naming its field, in vLLM's error shape (vLLM answers a
    value past the context the same way); a chat that sends neither field gets
    ``default_max_tokens`` (vLLM still clamps it to what the context leaves, where the native
    engine does the same; a completion's default is 16 on both), and ``n`` above
    :data:`~autospec.serve.schemas.MAX_CHOICES` is a 400 as on the native engine (vLLM has no
    bound: n=100 decoded 100 choices of up to max_tokens each). None: within bounds."""
    n = getattr(req, "n", None)
    if n is not None and n > MAX_CHOICES:
        return _error(f"n must be between 1 and {MAX_CHOICES}, got {n}", param="n")
    for field in ("max_completion_tokens", "max_tokens"):
        value = getattr(req, field, None)
        if value is not None and value > config.max_tokens_limit:
            return _error(f"{field} must be between 1 and {config.max_tokens_limit}, got "
                          f"{value} (the deployment's max_tokens_limit)", param=field)
    if route == "chat" and req.max_tokens is None and req.max_completion_tokens is None:
        req.max_tokens = config.default_max_tokens
    return None


async def _invalid(request: Request, exc: ValidationError) -> Response:
    """vLLM's answer to a body its request model refuses (its own handler)."""
    from fastapi.exceptions import RequestValidationError
    from vllm.entrypoints.serve.exception_handling.handlers.validation import (
        validation_exception_handler,
    )

    return await validation_exception_handler(request, RequestValidationError(exc.errors()))


def parse(data: dict[str, Any], model: type[BaseModel],
          content_format: Callable[[Any], str | None] | None = None) -> Any:
    """``data`` as vLLM's request ``model`` (or the ``ValidationError``, or the client error
    a vLLM validator raises past pydantic — an empty prompt's — that vLLM's server would
    answer); a 400 for a key at any level that vLLM's types do not
    declare (:func:`~autospec.serve.vllm_fields.unknown_keys`: vLLM would ignore it) —
    but a content part's undeclared key when ``content_format(request)`` is ``"openai"``:
    vLLM hands it to that chat template. The keys are read after vLLM's own validators have
    run on ``data``: they rename in place what vLLM still takes under an old name (a
    message's ``reasoning_content``)."""
    from vllm.exceptions import VLLMClientError

    try:
        req = model.model_validate(data)
    except (ValidationError, VLLMClientError) as exc:
        return exc
    unknown = unknown_keys(data, model)
    parts = any(is_content_part_key(k) for k in unknown)
    if parts and content_format is not None and content_format(req) == "openai":
        unknown = unknown_keys(data, model, taken=is_content_part_key)
    if unknown:
        many = len(unknown) > 1
        why = " (a content part's key reaches only a chat template of the \"openai\" " \
            "content format; this request's template renders content as a string)" \
            if parts else ""
        raise APIError(400, f"unknown field{'s' if many else ''} "
                       f"{', '.join(map(repr, unknown))}: vLLM's OpenAI server would ignore "
                       f"{'them' if many else 'it'}{why}", param=unknown[0],
                       code="unknown_field")
    return req


async def serve(server: Replica, request: Request, ctx: RequestContext,
                handler: Callable[..., Any], req: Any) -> Response:
    """Admit the request, run vLLM's ``handler`` on it, and answer with autospec's
    header and ``autospec`` object."""
    binding = server.bind(ctx)
    binding.unlogged = bool(getattr(req, "use_beam_search", False))  # see the module doc
    try:
        with binding:  # the engine proxy reads it when vLLM's handler calls generate
            result = await unless_disconnected(request, handler(req, request))
    except APIError:
        server.release(binding)
        raise
    except Exception as exc:  # what vLLM's server turns into an error answer, turned alike
        server.release(binding)
        return _error(exc)
    except BaseException:
        server.release(binding)
        raise
    if result is None:
        server.release(binding)
        return Response(status_code=499)  # the client left; nobody reads this
    if isinstance(result, AsyncIterator):
        return _BoundStream(server, binding, _with_info(result, binding),
                            media_type="text/event-stream",
                            headers={VERSION_HEADER: binding.version.name,
                                     "Cache-Control": "no-cache"})
    server.release(binding)
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    body = result.model_dump()
    if isinstance(result, ErrorResponse):
        return JSONResponse(body, status_code=result.error.code)
    if binding.served is None:
        return JSONResponse(body, headers={VERSION_HEADER: binding.version.name})
    body["autospec"] = autospec_info(binding.served).model_dump()
    return JSONResponse(body, headers=version_headers(binding.served))


def _error(exc: Exception | str, param: str | None = None) -> JSONResponse:
    """The answer vLLM's server gives for ``exc`` (its own mapping: a validation error is a
    400 naming the parameter, a server error a 500...), or a 400 of ``exc``'s text naming
    ``param``."""
    from vllm.entrypoints.serve.exception_handling.error_response import (
        create_error_response,
    )

    error = create_error_response(exc, param=param)
    return JSONResponse(error.model_dump(), status_code=error.error.code)


class _BoundStream(StreamingResponse):
    """A stream that releases its request when the response ends for any reason, including
    a client gone before the first chunk (the body never iterated)."""

    def __init__(self, server: Replica, binding: Binding, content: AsyncIterator[str],
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.server, self.binding = server, binding

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            with self.binding:  # vLLM's beam search calls the engine as the stream is read
                await super().__call__(scope, receive, send)
        finally:
            self.server.release(self.binding)


async def _with_info(events: AsyncIterator[str], binding: Binding) -> AsyncIterator[str]:
    """vLLM's server-sent events, the ``autospec`` object added to the last chunk before
    ``[DONE]``. A chunk that may be the last (a choice finished, or usage) is held until the
    next event says whether it was."""
    held: list[str] = []
    try:
        async for event in events:
            if event.startswith("data: [DONE]"):
                if held:
                    held[-1] = _add_info(held[-1], binding)
                for line in (*held, event):
                    yield line
                held = []
            elif _maybe_last(event):
                held.append(event)
            else:
                for line in (*held, event):
                    yield line
                held = []
        for line in held:
            yield line
    finally:
        await events.aclose()  # aborts the request in vLLM if it has not finished


def _payload(event: str) -> dict[str, Any] | None:
    if not event.startswith("data: "):
        return None
    try:
        data = json.loads(event[len("data: "):])
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _maybe_last(event: str) -> bool:
    data = _payload(event)
    if data is None or "choices" not in data:
        return False
    choices = data["choices"]
    return not choices or any(c.get("finish_reason") is not None for c in choices)


def _add_info(event: str, binding: Binding) -> str:
    data = _payload(event)
    if data is None or binding.served is None:
        return event
    data["autospec"] = autospec_info(binding.served).model_dump()
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"

