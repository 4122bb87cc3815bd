"""The JSON types of the scalar request fields, checked once for both engines' layers.

OpenAI's API refuses a string where it takes a number and a number where it takes a boolean;
autospec's own request models (:mod:`autospec.serve.schemas`) are strict alike. vLLM's
request models are not: pydantic's lax mode reads ``"temperature": "0.5"`` as 0.5,
``"temperature": true`` as 1.0, ``"max_tokens": "3"`` and ``2.0`` as integers and
``"stream": "yes"`` as true, so ``autospec serve --engine vllm`` answered 200 (and streamed)
where the native engine answered 400. Both layers (:func:`autospec.serve.http._read`,
:mod:`autospec.serve.vllm_http`) call :func:`check_field_types` on the parsed body before
their models read it: a field of :data:`FIELD_TYPES` with a value of another JSON type is a
400 naming it (:class:`~autospec.serve.errors.APIError`: ``param`` the field, ``code``
``invalid_value``), which the vLLM layer answers in vLLM's error shape, as its other
refusals (``code`` 400, ``tests/serve/test_vllm_openai_parity.py``). ``null`` is left to
each layer (the field's default).

Numbers take integers (``"temperature": 1``); integers take no fractional form (``2.0``);
booleans are neither numbers nor strings. Only the scalar fields both engines' routes
read or refuse are listed; a field's type in vLLM's request model is checked against this
table by ``tests/serve/test_field_types.py``.
"""

from __future__ import annotations

from typing import Any

from autospec.serve.errors import APIError

NUMBER, INTEGER, BOOLEAN = "number", "integer", "boolean"

_WORDS = {NUMBER: "Input should be a valid number", INTEGER: "Input should be a valid integer",
          BOOLEAN: "Input should be a valid boolean"}

_BOTH = {
    "temperature": NUMBER, "top_p": NUMBER, "presence_penalty": NUMBER,
    "frequency_penalty": NUMBER, "repetition_penalty": NUMBER, "min_p": NUMBER,
    "length_penalty": NUMBER, "max_tokens": INTEGER, "n": INTEGER, "seed": INTEGER,
    "top_k": INTEGER, "min_tokens": INTEGER, "stream": BOOLEAN, "ignore_eos": BOOLEAN,
    "echo": BOOLEAN, "use_beam_search": BOOLEAN, "include_stop_str_in_output": BOOLEAN,
    "skip_special_tokens": BOOLEAN, "add_special_tokens": BOOLEAN,
}
#: route -> field -> the JSON type its value must have (when not null)
FIELD_TYPES: dict[str, dict[str, str]] = {
    "chat": {**_BOTH, "max_completion_tokens": INTEGER, "logprobs": BOOLEAN,
             "top_logprobs": INTEGER, "parallel_tool_calls": BOOLEAN,
             "add_generation_prompt": BOOLEAN, "continue_final_message": BOOLEAN},
    "completions": {**_BOTH, "logprobs": INTEGER},
}


def is_json_type(value: Any, kind: str) -> bool:
    """Whether ``value`` (parsed JSON) is of the JSON type ``kind``."""
    if kind == BOOLEAN:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (kind == NUMBER and isinstance(value, float))


def check_field_types(data: dict[str, Any], route: str) -> None:
    """A 400 :class:`APIError` for the first field of ``data`` (body order) whose value is
    not of its JSON type on ``route`` (``chat`` or ``completions``)."""
    types = FIELD_TYPES[route]
    for name, value in data.items():
        kind = types.get(name)
        if kind is not None and value is not None and not is_json_type(value, kind):
            raise APIError(400, f"{name}: {_WORDS[kind]}", param=name, code="invalid_value")
