"""No key vLLM would ignore, at any level: the vLLM route's ``parse`` on vLLM's real request
models (no engine). A key that none of the types vLLM reads a place with declares is a 400
naming its dotted path; free-form values (a JSON schema, a
tool's parameters, ``chat_template_kwargs``...) are not walked; every body of the parity set
still parses. The walk reads the types themselves (pydantic models, ``TypedDict``s across
unions, dataclasses), shown on small types of the test's own."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Literal

import pytest

pytest.importorskip("vllm")

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12, as vLLM does
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

from autospec.serve.errors import APIError
from autospec.serve.vllm_fields import MAX_REPORTED, unknown_keys
from autospec.serve.vllm_http import parse

from .test_vllm_openai_parity import BODIES

MODELS = {"chat": ChatCompletionRequest, "completions": CompletionRequest}
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _refused(body: dict[str, Any], model: type[BaseModel] = ChatCompletionRequest) -> APIError:
    with pytest.raises(APIError) as refused:
        parse(body, model)
    assert refused.value.status == 400 and refused.value.code == "unknown_field"
    return refused.value


def test_a_misspelt_message_key_is_a_400_naming_its_path():
    body = {"messages": [*USER, {"role": "user", "content": "again", "nmae": "bob"}]}
    err = _refused(body)
    assert err.param == "messages.1.nmae"
    assert "'messages.1.nmae'" in err.message and "would ignore it" in err.message
    assert parse({"messages": body["messages"][:1]}, ChatCompletionRequest).messages == USER


@pytest.mark.parametrize("body, path", [
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "txt": 1}]}]},
     "messages.0.content.0.txt"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png", "detial": "low"}}]}]},
     "messages.0.content.0.image_url.detial"),
    ({"messages": [*USER, {"role": "assistant", "tool_calls": [{
        "id": "1", "type": "function", "function": {"name": "f", "arguments": "{}",
                                                    "args": "{}"}}]}]},
     "messages.1.tool_calls.0.function.args"),
    ({"messages": USER, "tools": [{**TOOL, "function": {**TOOL["function"],
                                                        "descripton": "d"}}]},
     "tools.0.function.descripton"),
    ({"messages": USER, "tools": [{**TOOL, "strict": True}]}, "tools.0.strict"),
    ({"messages": USER, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "f", "arguments": "{}"}}},
     "tool_choice.function.arguments"),
    ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "object"}, "strictt": True}}},
     "response_format.json_schema.strictt"),
    # the schema's own key is `schema` (an alias): its field name is not taken
    ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "schema": {}, "json_schema": {"type": "object"}}}},
     "response_format.json_schema.json_schema"),
    ({"messages": USER, "stream": True, "stream_options": {"include_usage": True,
                                                           "include_usge": True}},
     "stream_options.include_usge"),
    ({"messages": USER, "structured_outputs": {"choice": ["a", "b"], "regexp": "a"}},
     "structured_outputs.regexp"),
    ({"messages": USER, "structured_outputs": {"choice": ["a"], "_backend": "xgrammar"}},
     "structured_outputs._backend"),  # vLLM sets it itself (init=False): never the body's
])
def test_an_unknown_nested_key_is_a_400_naming_its_path(body, path):
    assert _refused(body).param == path


def test_a_completion_takes_the_same_walk():
    body = {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True,
                                                               "continuous_usage": True}}
    assert _refused(body, CompletionRequest).param == "stream_options.continuous_usage"
    assert _refused({"prompt": "hi", "temprature": 0}, CompletionRequest).param == "temprature"


def test_every_unknown_key_is_named_in_body_order_up_to_the_limit():
    messages = [{"role": "user", "content": "hi", f"k{i}": 1} for i in range(MAX_REPORTED + 3)]
    err = _refused({"messages": messages, "zz": 1})
    assert err.param == "messages.0.k0"
    assert unknown_keys({"messages": messages[:2], "zz": 1}, ChatCompletionRequest) == \
        ["messages.0.k0", "messages.1.k1", "zz"]
    assert len(unknown_keys({"messages": messages}, ChatCompletionRequest)) == MAX_REPORTED


def test_what_any_of_vllms_message_types_declares_is_taken():
    messages = [
        {"role": "system", "content": "be brief", "name": "ops"},
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "image_url", "image_url": {
                                         "url": "http://x/y.png", "detail": "low"}}]},
        {"role": "assistant", "content": None, "reasoning": "think", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "1"},
        {"role": "developer", "content": "x", "tools": [TOOL]},  # vLLM's own custom param
        {"role": "assistant", "content": "ok", "reasoning_content": "old name"},
    ]
    req = parse({"messages": messages, "max_tokens": 3}, ChatCompletionRequest)
    assert isinstance(req, ChatCompletionRequest)
    assert req.messages[-1]["reasoning"] == "old name"  # vLLM renames it: taken, not ignored


def test_free_form_values_are_not_walked():
    anything = {"type": "object", "whatever": {"nested": [{"deep": 1}]}}
    body = {"messages": USER, "tools": [{**TOOL, "function": {**TOOL["function"],
                                                              "parameters": anything}}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "p", "schema": anything}},
            "logit_bias": {"5": -1.0}, "chat_template_kwargs": {"enable_thinking": False,
                                                                "x": {"y": 1}},
            "vllm_xargs": {"any_key": 1}, "kv_transfer_params": {"a": {"b": 1}}}
    assert isinstance(parse(body, ChatCompletionRequest), ChatCompletionRequest)
    so = {"messages": USER, "structured_outputs": {"json": anything}}
    assert isinstance(parse(so, ChatCompletionRequest), ChatCompletionRequest)


@pytest.mark.parametrize("case", range(len(BODIES)))
def test_every_body_of_the_parity_set_parses_without_an_unknown_field(case):
    route, body, _ = BODIES[case]
    req = parse(copy.deepcopy(body), MODELS[route])
    if body.get("temperature") == "hot":  # the set's bodies vLLM's model refuses
        assert isinstance(req, ValidationError)
    elif body.get("prompt") == "":
        from vllm.exceptions import VLLMValidationError

        assert isinstance(req, VLLMValidationError)
    else:
        assert isinstance(req, MODELS[route])


def test_a_body_vllm_refuses_gets_vllms_answer_even_with_an_unknown_key():
    body = {"messages": [{"role": "user", "content": "hi", "nmae": "x"}], "temperature": "hot"}
    assert isinstance(parse(body, ChatCompletionRequest), ValidationError)


# -- the walk reads the types: a key is known if any member of a union declares it -----------

class _Text(TypedDict, total=False):
    type: Literal["text"]
    text: str


class _Picture(TypedDict, total=False):
    type: Literal["picture"]
    url: str


class _Sized(_Picture, total=False):
    width: int  # what an upgrade adds to one member


@dataclasses.dataclass
class _Options:
    level: int = 0
    _internal: int = dataclasses.field(default=0, init=False)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inner: _Text | None = None


class _Request(BaseModel):
    parts: list[_Text | _Picture]
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    options: _Options | None = None
    strict: _Strict | None = None


class _Upgraded(BaseModel):
    parts: list[_Text | _Sized]


def test_keys_come_from_every_member_of_a_union_and_follow_an_upgrade():
    parts = [{"type": "text", "text": "a"}, {"type": "picture", "url": "u", "width": 3}]
    assert unknown_keys({"parts": parts}, _Request) == ["parts.1.width"]
    assert unknown_keys({"parts": parts}, _Upgraded) == []  # the member declares it now
    assert unknown_keys({"parts": [{"txt": "a"}]}, _Upgraded) == ["parts.0.txt"]


def test_aliases_dataclasses_and_forbidding_models():
    assert unknown_keys({"parts": [], "schema": {"any": {"thing": 1}}}, _Request) == []
    assert unknown_keys({"parts": [], "schema_": {}}, _Request) == ["schema_"]
    assert unknown_keys({"parts": [], "options": {"level": 1, "lvl": 2}}, _Request) == \
        ["options.lvl"]
    assert unknown_keys({"parts": [], "options": {"_internal": 1}}, _Request) == \
        ["options._internal"]
    # a model that forbids extras answers them itself (pydantic's error); inside it, walked
    assert unknown_keys({"parts": [], "strict": {"x": 1, "inner": {"txt": 1}}}, _Request) == \
        ["strict.inner.txt"]


class _Wrapped(RootModel[list[_Text]]):
    pass


class _HoldsRoot(BaseModel):
    wrapped: _Wrapped


def test_a_root_model_is_walked_as_its_root():
    assert unknown_keys({"wrapped": [{"text": "a", "txt": "b"}]}, _HoldsRoot) == \
        ["wrapped.0.txt"]


def test_the_route_answers_an_openai_shaped_400_before_vllms_handler_runs():
    from types import SimpleNamespace

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from autospec.serve.config import ServeConfig
    from autospec.serve.errors import install_handlers
    from autospec.serve.vllm_http import add_routes

    called = []

    class Layer:  # what add_routes needs of a replica's VllmLayer, up to the handler
        config, api_args = ServeConfig(), SimpleNamespace()

        async def openai_api(self):  # type: ignore[no-untyped-def]
            called.append(True)

    app = FastAPI()
    install_handlers(app)
    add_routes(app, Layer())  # type: ignore[arg-type]
    body = {"messages": [{"role": "user", "content": "hi", "nmae": "bob"}], "max_tokens": 2}
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and not called
    error = r.json()["error"]
    assert (error["param"], error["code"], error["type"]) == \
        ("messages.0.nmae", "unknown_field", "invalid_request_error")
    assert "vLLM's OpenAI server would ignore it" in error["message"]


def test_an_error_a_vllm_validator_raises_past_pydantic_is_vllms_400_not_a_500():
    """An empty prompt: vLLM's validator raises its own VLLMValidationError, which pydantic
    does not wrap (it answered 500 'internal error' here before)."""
    from types import SimpleNamespace

    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.exceptions import VLLMValidationError

    from autospec.serve.config import ServeConfig
    from autospec.serve.errors import install_handlers
    from autospec.serve.vllm_http import add_routes

    assert isinstance(parse({"prompt": ""}, CompletionRequest), VLLMValidationError)

    class Layer:
        config, api_args = ServeConfig(), SimpleNamespace()

    app = FastAPI()
    install_handlers(app)
    add_routes(app, Layer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        r = client.post("/v1/completions", json={"prompt": "", "max_tokens": 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["type"], error["code"]) == ("prompt", "BadRequestError", 400)
    assert "must be provided and non-empty" in error["message"]


PART = [{"role": "user", "content": [{"type": "text", "text": "hi",
                                      "cache_control": {"type": "ephemeral"}}]}]


@pytest.mark.parametrize("fmt", [None, "string"])
def test_a_content_parts_key_is_refused_where_the_template_drops_it(fmt):
    with pytest.raises(APIError) as refused:
        parse({"messages": PART}, ChatCompletionRequest, content_format=lambda req: fmt)
    assert refused.value.param == "messages.0.content.0.cache_control"
    assert "openai" in refused.value.message


def test_a_content_parts_key_is_taken_where_the_template_reads_it():
    asked = []

    def fmt(req: Any) -> str:
        asked.append(req)
        return "openai"

    req = parse({"messages": PART}, ChatCompletionRequest, content_format=fmt)
    assert isinstance(req, ChatCompletionRequest) and len(asked) == 1
    # only a content part's keys: a misspelt key elsewhere is still refused
    err = _refused({"messages": [{**PART[0], "nmae": "x"}]}, ChatCompletionRequest)
    assert err.param == "messages.0.content.0.cache_control"
    with pytest.raises(APIError) as refused:
        parse({"messages": [{**PART[0], "nmae": "x"}]}, ChatCompletionRequest,
              content_format=fmt)
    assert refused.value.param == "messages.0.nmae"


def test_the_format_is_not_asked_without_a_content_parts_key():
    def fmt(req: Any) -> str:
        raise AssertionError("asked")

    parse({"messages": USER}, ChatCompletionRequest, content_format=fmt)


def test_the_deployments_token_bounds_apply_on_vllm_as_on_native():
    import json

    from autospec.serve.config import ServeConfig
    from autospec.serve.vllm_http import limit_tokens

    config = ServeConfig(max_tokens_limit=100, default_max_tokens=32)
    for field in ("max_tokens", "max_completion_tokens"):
        req = parse({"messages": USER, field: 101}, ChatCompletionRequest)
        refused = limit_tokens(req, config, "chat")
        assert refused is not None and refused.status_code == 400
        error = json.loads(bytes(refused.body))["error"]  # vLLM's shape: code = the status
        assert error["param"] == field and error["code"] == 400
        assert "max_tokens_limit" in error["message"]
    assert limit_tokens(parse({"prompt": "x", "max_tokens": 101}, CompletionRequest), config,
                        "completions") is not None
    omitted = parse({"messages": USER}, ChatCompletionRequest)
    assert limit_tokens(omitted, config, "chat") is None
    assert omitted.max_tokens == 32  # default_max_tokens, as the native engine's chat
    sent = parse({"messages": USER, "max_completion_tokens": 100}, ChatCompletionRequest)
    assert limit_tokens(sent, config, "chat") is None
    assert sent.max_tokens is None and sent.max_completion_tokens == 100
    completion = parse({"prompt": "x"}, CompletionRequest)
    assert limit_tokens(completion, config, "completions") is None
    assert completion.max_tokens == 16  # vLLM's and the native engine's completion default


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_n_is_bounded_on_vllm_as_on_native(route):
    """vLLM's model takes any n (n=100 decoded 100 choices); the native engine's bound, in
    vLLM's error shape as the other deployment bounds."""
    import json

    from autospec.serve.config import ServeConfig
    from autospec.serve.schemas import MAX_CHOICES
    from autospec.serve.vllm_http import limit_tokens

    base = {"messages": USER} if route == "chat" else {"prompt": "x"}
    config = ServeConfig()
    refused = limit_tokens(parse({**base, "n": MAX_CHOICES + 1}, MODELS[route]), config, route)
    assert refused is not None and refused.status_code == 400
    error = json.loads(bytes(refused.body))["error"]
    assert error["param"] == "n" and f"between 1 and {MAX_CHOICES}" in error["message"]
    assert limit_tokens(parse({**base, "n": MAX_CHOICES}, MODELS[route]), config, route) is None


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_stream_options_without_stream_on_vllm_as_on_native(route):
    """vLLM's layer refuses stream options without ``stream: true`` and takes an empty
    object (it asks for nothing); the native engine answers both alike
    (tests/serve/test_strict_fields.py)."""
    from vllm.exceptions import VLLMValidationError

    base = {"messages": USER} if route == "chat" else {"prompt": "x"}
    assert parse({**base, "stream_options": {}}, MODELS[route]).stream_options is not None
    refused = parse({**base, "stream_options": {"include_usage": True}}, MODELS[route])
    assert isinstance(refused, VLLMValidationError) and "stream" in str(refused)
