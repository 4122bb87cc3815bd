"""The scalar fields' JSON types, checked once for both engines
(:mod:`autospec.serve.field_types`). vLLM's request models read ``"0.5"`` as a number,
``true`` as 1.0, ``"3"`` and ``2.0`` as integers and ``"yes"`` as true: on ``--engine vllm``
those bodies were answered 200 (``"stream": "yes"`` streamed) where the native engine
answered 400. The vLLM route runs here up to vLLM's handler (none is built: the check comes
first), the native one on the tiny random-init target."""

from __future__ import annotations

import typing
from types import SimpleNamespace
from typing import Any

import pytest

from autospec.serve.field_types import BOOLEAN, FIELD_TYPES, INTEGER, NUMBER, is_json_type

CHAT = [{"role": "user", "content": "Hi"}]
#: (route, field, value): what vLLM's lax models took and autospec's native layer refuses
LAX = [
    ("chat", "temperature", "0.5"), ("chat", "temperature", True), ("chat", "top_p", "1"),
    ("chat", "max_tokens", "3"), ("chat", "max_tokens", 2.0), ("chat", "seed", "1"),
    ("chat", "stream", "yes"), ("chat", "stream", 1), ("chat", "logprobs", "true"),
    ("chat", "max_completion_tokens", 4.0), ("chat", "n", True),
    ("completions", "max_tokens", "3"), ("completions", "logprobs", True),
    ("completions", "presence_penalty", "0"), ("completions", "ignore_eos", "false"),
]


def _body(route: str, field: str, value: Any) -> dict[str, Any]:
    base = {"messages": CHAT} if route == "chat" else {"prompt": "hi"}
    return {**base, "max_tokens": 2, field: value}


def _path(route: str) -> str:
    return "/v1/chat/completions" if route == "chat" else "/v1/completions"


def _refused(r: Any, field: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"], error["type"]) == \
        (field, "invalid_value", "invalid_request_error")
    assert error["message"].startswith(f"{field}: Input should be a valid ")


@pytest.fixture(scope="module")
def vllm_client():  # type: ignore[no-untyped-def]
    pytest.importorskip("vllm")
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from autospec.serve.config import ServeConfig
    from autospec.serve.errors import install_handlers
    from autospec.serve.vllm_http import add_routes

    class Layer:  # what add_routes needs of a replica's VllmLayer, up to vLLM's handler
        config, api_args = ServeConfig(), SimpleNamespace()

        async def openai_api(self):  # type: ignore[no-untyped-def]
            raise AssertionError("the body reached vLLM's handler")

    app = FastAPI()
    install_handlers(app)
    add_routes(app, Layer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        yield client


@pytest.mark.parametrize("route, field, value", LAX)
def test_vllms_route_refuses_a_value_of_another_json_type(vllm_client, route, field, value):
    """In vLLM's error shape (code 400), as ``vllm serve`` and the layer's other refusals
    answer: the parity test compares the shapes (a native-shaped answer failed it)."""
    r = vllm_client.post(_path(route), json=_body(route, field, value))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (field, 400)
    assert error["message"].startswith(f"{field}: Input should be a valid ")


@pytest.mark.parametrize("route, field, value", LAX)
def test_the_native_route_answers_the_same_tiny(client, route, field, value):
    _refused(client.post(_path(route), json=_body(route, field, value)), field)


def test_json_types():
    assert is_json_type(1, NUMBER) and is_json_type(0.5, NUMBER)
    assert not is_json_type(True, NUMBER) and not is_json_type("1", NUMBER)
    assert is_json_type(3, INTEGER) and not is_json_type(3.0, INTEGER)
    assert not is_json_type(False, INTEGER) and not is_json_type(1, BOOLEAN)
    assert is_json_type(False, BOOLEAN)


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_each_field_has_that_type_in_vllms_request_model(route):
    """vLLM's model for the route declares every field of the table, as that type (so the
    check refuses nothing vLLM's own server would read as its type)."""
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    model = ChatCompletionRequest if route == "chat" else CompletionRequest
    python = {NUMBER: float, INTEGER: int, BOOLEAN: bool}
    for field, kind in FIELD_TYPES[route].items():
        assert field in model.model_fields, field
        annotation = model.model_fields[field].annotation
        members = set(typing.get_args(annotation)) or {annotation}
        assert python[kind] in members, (field, annotation)
