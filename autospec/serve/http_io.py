"""The HTTP plumbing both OpenAI layers share (autospec's, :mod:`autospec.serve.http`, and
vLLM's, :mod:`autospec.serve.vllm_http`): autospec's headers, bodies read into the OpenAI
error shape, the request context, a client that disconnects, and the ``autospec`` object.

Bodies are read here, not by FastAPI, so that every bad input gets a small 4xx in the OpenAI
error shape: an oversized body (413), invalid UTF-8, malformed JSON, NaN/Infinity, a
non-object, a lone surrogate, or any field pydantic rejects (400).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from autospec.engine.stats import RequestStats
from autospec.names import is_name
from autospec.serve.errors import APIError, validation_error
from autospec.serve.requests import Prepared, RequestContext, Served, Streamed
from autospec.serve.schemas import AutospecInfo, Usage
from autospec.serve.segments import SEGMENT_HEADER, SegmentRule, rule_segment

VERSION_HEADER = "x-autospec-speculator"
DRAFTED_BY_HEADER = "x-autospec-drafted-by"
log = logging.getLogger(__name__)

LOG_HEADER = "x-autospec-log"
REPLICA_HEADER = "x-autospec-replica"
_OFF = ("off", "0", "false", "no")
_ON = ("on", "1", "true", "yes")

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


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
    watch.add_done_callback(_quietly)  # Ray cancels ``receive`` when it cancels the handler
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is itself cancelled (Ray Serve: client gone)
        for t in (task, watch):
            if not t.done():
                t.cancel()
    if not task.done() or task.cancelled():
        return None
    return task.result()


def _quietly(watch: asyncio.Future[None]) -> None:
    """Take the disconnect watch's exception, if any, so that asyncio does not log it as
    never retrieved: when Ray Serve cancels a handler whose client left, ``receive`` raises
    Ray's ``TaskCancelledError`` in the watch, and nobody is left to read it. Any other
    exception (the request is then treated as abandoned too) is logged once."""
    if watch.cancelled() or (exc := watch.exception()) is None:
        return
    if type(exc).__name__ != "TaskCancelledError":  # Ray's, named so ray is not imported
        log.warning("the disconnect watch failed (the request is dropped as abandoned): %r",
                    exc)


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def client_gone() -> Response:
    # nobody reads this answer; 499 ("client closed request") names it in access logs
    return Response(status_code=499)


class AbandoningStream(StreamingResponse):
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


def context(request: Request, route: str, body: Mapping[str, Any] | None = None,
            rules: Sequence[SegmentRule] = ()) -> RequestContext:
    """The request's segment and logging choice, resolved once: the ``x-autospec-segment``
    header if sent, else the first of ``rules`` matching the headers and ``body`` (the
    parsed JSON), else ``route`` (:mod:`autospec.serve.segments`); and the body's ``user``."""
    segment = request.headers.get(SEGMENT_HEADER)
    if segment is None:
        segment = rule_segment(rules, headers=request.headers, body=body or {}) or route
    segment = segment.strip()
    if not is_name(segment):
        raise APIError(400, f"{SEGMENT_HEADER} must be 1-64 letters, digits or ._- "
                       f"starting with a letter or digit", param=SEGMENT_HEADER,
                       code="invalid_header")
    log_text = _log_choice(request.headers.get(LOG_HEADER, "on"))
    user = (body or {}).get("user")
    return RequestContext(route=route, segment=segment, log_text=log_text,
                          user=user if isinstance(user, str) and user else None)


def _log_choice(value: str) -> bool:
    """Whether to keep the request's text, from ``x-autospec-log``; a value that is neither
    on nor off is refused rather than read as on (a mistyped opt-out must not store text)."""
    choice = value.strip().lower()
    if choice not in _ON + _OFF:
        raise APIError(400, f"{LOG_HEADER} must be one of {', '.join(_ON + _OFF)}, got "
                       f"{value.strip()[:40]!r}", param=LOG_HEADER, code="invalid_header")
    return choice in _ON


def validated(data: dict[str, Any], model: type[M]) -> M:
    """``data`` as ``model``, or an :class:`APIError` saying what is wrong with it."""
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
        data = json.loads(text, parse_constant=_no_constants, parse_float=_finite)
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


def _finite(text: str) -> float:
    """A JSON number as a float; one too large for a float (``1e400``) is refused, as
    ``Infinity`` is, rather than read as infinite."""
    value = float(text)
    if not math.isfinite(value):
        raise APIError(400, f"request body is not valid JSON: {text[:40]} is out of range "
                       "for a number", code="invalid_json")
    return value


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


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
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


def usage(served: Served, prepared: Prepared) -> Usage:
    n_out = sum(len(result.token_ids) for result in served.choices)
    return Usage(prompt_tokens=len(prepared.prompt_ids), completion_tokens=n_out,
                 total_tokens=len(prepared.prompt_ids) + n_out)


def autospec_info(served: Served) -> AutospecInfo:
    """The ``autospec`` object: over all choices when there are several."""
    stats = served.result.stats if not served.extra else \
        RequestStats.merged([result.stats for result in served.choices])
    return AutospecInfo.from_stats(served.version.name, stats, served.drafted_by)
