"""A pydantic model's validation error in a command line's words: each error after the
option it concerns (``--holdout-fraction: …``; a nested field's path after it,
``--segment-rules (segments.0.system_sha256): …``), pydantic's ``Value error, `` prefix and
its dump of the input left out (the input may hold an API key; a check over the whole
model names no option)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError


def _one(error: Mapping, options: Mapping[str, str]) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    loc = [str(part) for part in error["loc"]]
    if not loc:
        return message
    option = "--" + options.get(loc[0], loc[0]).replace("_", "-")
    path = f" ({'.'.join(loc)})" if len(loc) > 1 or loc[0] in options else ""
    return f"{option}{path}: {message}"


def first_error(exc: ValidationError, options: Mapping[str, str] | None = None) -> str:
    """The first error (a request checked field by field stops at what it names first);
    ``options``: the option of each field not named after it."""
    return _one(exc.errors()[0], options or {})


def option_errors(exc: ValidationError, options: Mapping[str, str] | None = None) -> str:
    """Every error, one line each (``options`` as for :func:`first_error`)."""
    return "\n".join(_one(e, options or {}) for e in exc.errors())
