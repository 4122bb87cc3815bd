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
