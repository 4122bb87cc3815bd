"""A pydantic model's validation error in a command line's words: each error after the
option it concerns (``--holdout-fraction: …``), pydantic's ``Value error, `` prefix and its
input dump left out (the input may hold an API key; a whole-config check names no field)."""

from __future__ import annotations

from pydantic import ValidationError


def _one(error: dict) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:
        return message
    return f"--{str(error['loc'][0]).replace('_', '-')}: {message}"


def first_error(exc: ValidationError) -> str:
    """The first error (a request checked field by field stops at what it names first)."""
    return _one(exc.errors()[0])


def option_errors(exc: ValidationError) -> str:
    """Every error, one line each."""
    return "\n".join(_one(e) for e in exc.errors())
