"""A pydantic model's validation error in a command line's words: each error after the
option it concerns (``--holdout-fraction: …``; a nested field's path after it,
``--segment-rules (segments.0.system_sha256): …``), pydantic's ``Value error, `` prefix and
its dump of the input left out (the input may hold an API key; a check over the whole
model names no option), and its wording of an unknown key or a value of the wrong type
(``Extra inputs are not permitted``, ``Input should be a valid string``) in plain words."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError

#: what a value of each type is, in words (the input's kind, never its value)
_KINDS = {bool: "true/false", int: "a number", float: "a number", list: "a list",
          dict: "a mapping", str: "text", type(None): "nothing"}


def _words(error: Mapping) -> str:
    """The error's message: pydantic's for a few types in plain words (a key no field
    takes, a value that should be text or a mapping), else pydantic's own."""
    kind = _KINDS.get(type(error.get("input")), "something else")
    if error["type"] == "extra_forbidden":
        return "unknown key (check its spelling)"
    if error["type"] == "string_type":  # a YAML file's yes, 7 or 1.5 unquoted
        quote = " (quote it in YAML)" if isinstance(error.get("input"), bool | int | float) else ""
        return f"expected text, not {kind}{quote}"
    if error["type"] in ("dict_type", "model_type"):
        return f"expected a mapping of keys to values, not {kind}"
    return str(error["msg"]).removeprefix("Value error, ")


def _one(error: Mapping, options: Mapping[str, str]) -> str:
    message = _words(error)
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


def file_errors(exc: ValidationError, field: str, path: object) -> str | None:
    """Every error, one line each, after ``path`` — the file an option read ``field`` from
    — when all are ``field``'s (a nested one's path after the file:
    ``rules.yaml (segments.0): …``), as the option's other errors about that file read;
    None when another field has one too (then :func:`option_errors`)."""
    errors = exc.errors()
    if not errors or any(tuple(e["loc"][:1]) != (field,) for e in errors):
        return None
    return "\n".join(f"{path}" + (f" ({'.'.join(map(str, e['loc']))})" if len(e["loc"]) > 1
                                   else "") + f": {_words(e)}" for e in errors)
