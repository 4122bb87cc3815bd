"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``.

:class:`APIError` is what route code raises for a request it refuses; :func:`install_handlers`
maps it, request validation errors, :class:`~autospec.engine.interface.RequestError` and
``ValueError`` (bad input found deeper down) to small 4xx answers. A genuine bug still answers
500 in the same shape (and is logged with its traceback), never an HTML page.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from autospec.engine.interface import RequestError

log = logging.getLogger(__name__)

_MESSAGE_LIMIT = 500


class APIError(Exception):
    """A refused request: HTTP status, OpenAI error type, optional param and code."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers


def error_response(status: int, message: str, *, type: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message[:_MESSAGE_LIMIT], "type": type,
                      "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def validation_error(exc: ValidationError | RequestValidationError) -> APIError:
    """The first problem of a pydantic validation error, as a 400 naming the field. A key
    no model declares goes first: across a union (a message's content, a string or a list
    of parts) the other members' complaints (``Input should be a valid string``) would hide
    the key's name."""
    errors = exc.errors()
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    first = (extra or errors or [{"loc": (), "msg": "invalid request"}])[0]
    loc = [str(p) for p in first.get("loc", ()) if not _is_union_tag(p)]
    param = ".".join(loc) or None
    # a validator's ValueError reads "Value error, <its message>": the message is enough
    msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    text = f"{param}: {msg}" if param else msg
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problems)"
    return APIError(400, text, param=param, code="invalid_value")


def _is_union_tag(part: object) -> bool:
    """pydantic's loc names union members (``str``, ``list[int]``); they are not fields."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part)


_TYPE_TAGS = {"body", "str", "int", "float", "bool", "none", "dict", "list", "TextPart"}


def install_handlers(app: FastAPI) -> None:
    """Register the OpenAI-shaped handlers on ``app``."""

    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, type=exc.type, param=exc.param,
                              code=exc.code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = validation_error(exc)
        return error_response(err.status, err.message, param=err.param, code=err.code)

    @app.exception_handler(RequestError)
    async def _request(request: Request, exc: RequestError) -> JSONResponse:
        # the prompt as the route takes it, as OpenAI names it
        chat = request.url.path.rstrip("/").endswith("/chat/completions")
        return error_response(400, str(exc), param="messages" if chat else "prompt",
                              code="context_length_exceeded" if "exceeds" in str(exc)
                              else "invalid_prompt")

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError) -> JSONResponse:
        return error_response(400, str(exc), code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), type=kind)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}",
                              type="internal_error")
