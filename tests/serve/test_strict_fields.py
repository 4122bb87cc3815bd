"""Loose typing refused: booleans are not numbers, strings are not booleans, and a ``null``
means the documented default (issue 16, item 10). Tiny random-init target."""

from __future__ import annotations

import pytest

CHAT = [{"role": "user", "content": "Hi"}]


def _error(r, param: str) -> dict:  # type: ignore[no-untyped-def]
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and param in err["message"]
    return err


@pytest.mark.parametrize("field, value", [
    ("max_tokens", True), ("max_tokens", False), ("temperature", True), ("top_p", True),
    ("top_k", True), ("seed", False), ("n", True), ("stream", "yes"), ("stream", 1),
    ("ignore_eos", "true"), ("presence_penalty", False),
])
def test_completion_booleans_and_strings_are_not_numbers_tiny(client, field, value):
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, field: value})
    _error(r, field)


@pytest.mark.parametrize("prompt", [[True], [5, False, 7]])
def test_boolean_token_ids_are_refused_tiny(client, prompt):
    err = _error(client.post("/v1/completions", json={"prompt": prompt}), "prompt")
    assert "boolean" in err["message"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_chat_boolean_max_tokens_is_refused_tiny(client, field):
    r = client.post("/v1/chat/completions", json={"messages": CHAT, field: True})
    _error(r, field)


def test_null_max_tokens_on_completions_is_openais_default_16_tiny(client):
    body = {"prompt": "Hello", "ignore_eos": True, "temperature": 0}
    omitted = client.post("/v1/completions", json=body).json()
    null = client.post("/v1/completions", json=body | {"max_tokens": None}).json()
    assert omitted["usage"]["completion_tokens"] == 16
    assert null["usage"]["completion_tokens"] == 16
    assert null["choices"][0]["text"] == omitted["choices"][0]["text"]


def test_null_sampling_fields_mean_their_defaults_tiny(client):
    body = {"prompt": "Hello", "max_tokens": 3, "temperature": None, "top_p": None,
            "stream": None, "n": None, "seed": 7}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 3


def test_null_max_tokens_on_chat_is_the_servers_default_tiny(client, server):
    r = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": None,
                                                  "ignore_eos": True, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == server.config.default_max_tokens


def test_integers_stay_valid_numbers_tiny(client):
    r = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2,
                                             "temperature": 1, "top_p": 1})
    assert r.status_code == 200, r.text


def test_an_unknown_field_is_a_400_naming_it_never_ignored_tiny(client):
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temprature": 0})
    err = _error(r, "temprature")
    assert err["code"] == "unknown_field"


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"}}),
    ("/v1/chat/completions", {"messages": CHAT, "tool_choice": "auto"}),
    ("/v1/completions", {"prompt": "hi", "min_p": 0.1}),
])
def test_a_field_the_vllm_engine_serves_says_so_tiny(client, route, body):
    field = next(k for k in body if k not in ("messages", "prompt"))
    err = _error(client.post(route, json=body), field)
    assert err["code"] == "unsupported_field" and "--engine vllm" in err["message"]


def test_unknown_fields_of_a_message_are_refused_not_dropped_tiny(client):
    messages = [{"role": "user", "content": "Hi", "name": "bob"}]
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.name"


def test_every_field_said_to_be_served_by_vllm_is_in_vllms_request_model_for_the_route():
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from autospec.serve.schemas import VLLM_FIELDS, known_fields

    for route, model in (("chat", ChatCompletionRequest), ("completions", CompletionRequest)):
        taken = known_fields(model)
        assert taken >= VLLM_FIELDS[route], (route, sorted(VLLM_FIELDS[route] - taken))


def test_logit_bias_is_applied_by_the_native_engine_and_logged_tiny(client, db):
    r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 6,
                                             "temperature": 0, "ignore_eos": True,
                                             "logit_bias": {"5": 100}})
    assert r.status_code == 200, r.text
    from .helpers import wait_for_rows

    row = wait_for_rows(db, 1)[-1]
    assert row.sampling["logit_bias"] == {"5": 100.0}
    from autospec.store.codec import unpack_ids

    assert set(unpack_ids(row.output_ids)) == {5}


@pytest.mark.parametrize("bias", [{"abc": 1}, {"5": 101}, {"5": True}, {"999999": 1}])
def test_a_bad_logit_bias_is_a_400_naming_it_tiny(client, bias):
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2,
                                             "logit_bias": bias})
    _error(r, "logit_bias")


def test_a_stream_option_the_native_engine_does_not_honour_is_refused_tiny(client):
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True,
                                             "stream_options": {"continuous_usage_stats": True}})
    err = _error(r, "stream_options")
    assert "continuous_usage_stats" in err["message"]


def test_penalties_are_applied_by_the_native_engine_and_logged_tiny(client, db):
    body = {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    plain = client.post("/v1/completions", json=body)
    r = client.post("/v1/completions", json=body | {"frequency_penalty": 2.0,
                                                    "presence_penalty": 2.0})
    assert plain.status_code == r.status_code == 200, r.text
    from .helpers import wait_for_rows

    row = wait_for_rows(db, 2)[-1]
    assert row.sampling["frequency_penalty"] == 2.0 and row.sampling["presence_penalty"] == 2.0
    from autospec.store.codec import unpack_ids

    ids = unpack_ids(row.output_ids)
    assert len(set(ids)) == len(ids)  # a repeat costs more than the tiny target's margins


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_a_penalty_outside_openais_range_is_a_400_tiny(client, field):
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, field: 2.5})
    _error(r, field)


def test_the_vllm_hint_is_given_only_where_vllm_takes_the_field_on_that_route(client):
    chat = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "suffix": "x"})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "unknown_field"
    completion = client.post("/v1/completions", json={"prompt": "hi", "tool_choice": "auto"})
    assert completion.status_code == 400 and \
        completion.json()["error"]["code"] == "unknown_field"
    tools = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"})
    assert tools.json()["error"]["code"] == "unsupported_field"
    assert "--engine vllm" in tools.json()["error"]["message"]


def test_refusals_name_their_field(client):
    part = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]})
    assert part.status_code == 400
    assert part.json()["error"]["param"] == "messages.0.content.0.cache_control"
    for body, param in (
            ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
             "tools"),
            ({"messages": [{"role": "user", "content": "hi"}], "stream": True, "n": 2}, "n"),
            ({"messages": [{"role": "user", "content": "hi"}], "stream": True,
              "logprobs": True}, "logprobs")):
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    for body, param in (({"echo": True}, "echo"), ({"best_of": 2}, "best_of"),
                        ({"suffix": "end"}, "suffix")):
        r = client.post("/v1/completions", json={"prompt": "hi", **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2,
                                                 "best_of": 1}).status_code == 200


@pytest.mark.parametrize("route, base", [("/v1/completions", {"prompt": "hi"}),
                                         ("/v1/chat/completions", {"messages": CHAT})])
@pytest.mark.parametrize("stream", [False, None])
def test_stream_options_without_stream_is_refused_as_openai_and_vllm_do_tiny(client, route,
                                                                             base, stream):
    """vLLM answers 400 ("Stream options can only be defined when `stream=True`"), as
    OpenAI does; the native engine took it and answered 200."""
    body = {**base, "max_tokens": 2, "stream_options": {"include_usage": True}}
    if stream is not None:
        body["stream"] = stream
    err = _error(client.post(route, json=body), "stream_options")
    assert "stream" in err["message"]
    for empty in (None, {}):  # asks for nothing: taken, as vLLM's layer takes it
        assert client.post(route, json={**base, "max_tokens": 2, "stream_options": empty}) \
            .status_code == 200
