"""The OpenAI-compatible API on the tiny target, in process (FastAPI TestClient, no Ray)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from autospec import store
from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.store.codec import unpack_ids
from autospec.store.models import Request

CHAT = [{"role": "user", "content": "Write a haiku about speculative decoding."}]


def _events(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]


def _rows(db) -> list[Request]:  # type: ignore[no-untyped-def]
    with store.session_scope(db, readonly=True) as session:
        return list(session.scalars(select(Request).order_by(Request.id)))


def test_completion_matches_the_engine_and_names_its_version(client, server, tiny_llm):
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "Once upon a time",
                                              "max_tokens": 12, "temperature": 0,
                                              "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert r.headers["x-autospec-speculator"] == body["autospec"]["version"] == "builtin-ngram"
    ids = tiny_llm.encode_prompt("Once upon a time")
    plain = SpeculativeEngine(tiny_llm).generate(ids, SamplingParams(12, ignore_eos=True))
    assert body["choices"][0]["text"] == plain.text
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 12,
                             "total_tokens": len(ids) + 12}
    info = body["autospec"]
    assert info["tau"] == pytest.approx((info["num_accepted_tokens"] + info["num_drafts"])
                                        / info["num_drafts"])
    assert sum(info["accepted_per_position"][:1]) <= info["num_drafts"]


def test_chat_and_token_id_prompts(client, tiny_llm):
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": CHAT,
                                                   "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] == len(tiny_llm.encode_chat(CHAT))
    r = client.post("/v1/completions", json={"prompt": [1, 2, 3, 4], "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 4


def test_models_health_and_metrics(client, server):
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["version"] == "builtin-ngram"
    client.post("/v1/completions", json={"prompt": "abc abc abc", "max_tokens": 8})
    text = client.get("/metrics").text
    for name in ("autospec:spec_decode_num_drafts_total", "autospec:generation_tokens_total",
                 "autospec:spec_decode_num_draft_tokens_total",
                 "autospec:spec_decode_num_accepted_tokens_total",
                 "autospec:request_latency_seconds_bucket",
                 "autospec:time_to_first_token_seconds_bucket",
                 'autospec:speculator_info{kind="ngram",version="builtin-ngram"} 1.0',
                 "autospec_traffic_rows_total"):
        assert name in text, name
    assert 'autospec:generation_tokens_total{version="builtin-ngram"} 8.0' in text


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_stream_equals_non_stream_and_ends_with_done(client, route):
    base = {"max_tokens": 10, "temperature": 0, "ignore_eos": True}
    base |= {"prompt": "The quick brown fox"} if "chat" not in route else {"messages": CHAT}
    whole = client.post(route, json=base).json()
    r = client.post(route, json=base | {"stream": True,
                                        "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    *chunks, last = [json.loads(e) for e in events[:-1]]
    if "chat" in route:
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        expected = whole["choices"][0]["message"]["content"]
    else:
        text = "".join(c["choices"][0]["text"] for c in chunks)
        expected = whole["choices"][0]["text"]
    assert text == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # as OpenAI and vLLM send it: a last chunk of no choices carries the usage (and autospec's
    # object, as on the vLLM engine)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 10
    assert last["autospec"]["version"] == r.headers["x-autospec-speculator"]
    assert all("autospec" not in c and "usage" not in c for c in chunks)
    # usage only when asked for (stream_options.include_usage), as OpenAI and vLLM send it
    for options in ({}, {"stream_options": {"include_usage": False}}):
        plain = [json.loads(e) for e in _events(
            client.post(route, json=base | {"stream": True, **options}).text)[:-1]]
        assert "usage" not in plain[-1] and plain[-1]["autospec"]["version"]
    bad = client.post(route, json=base | {"stream": True, "stream_options": {
        "include_usage": "yes"}})
    assert bad.status_code == 400 and "include_usage" in bad.json()["error"]["message"]


def test_stop_strings_cut_the_text_in_stream_and_not(client, tiny_llm):
    free = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 12,
                                                 "temperature": 0, "ignore_eos": True}).json()
    text = free["choices"][0]["text"]
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip()
    req = {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
           "stop": [stop]}
    cut = client.post("/v1/completions", json=req).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["text"] == text[: text.find(stop)]
    streamed = client.post("/v1/completions", json=req | {"stream": True})
    pieces = [json.loads(e)["choices"][0]["text"] for e in _events(streamed.text)[:-1]]
    assert "".join(pieces) == cut["choices"][0]["text"]


def test_seeded_sampling_reproduces(client):
    req = {"prompt": "Tell me", "max_tokens": 10, "temperature": 0.9, "top_p": 0.95,
           "top_k": 50, "seed": 1234}
    a = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    b = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    assert a == b


def test_each_request_is_logged_with_segment_ids_and_stats(client, server, db, tiny_llm):
    client.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 5,
                                         "temperature": 0})
    client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 5},
                headers={"x-autospec-segment": "support"})
    client.post("/v1/completions", json={"prompt": "secret prompt", "max_tokens": 5,
                                         "stream": True}, headers={"x-autospec-log": "off"})
    assert server.writer.flush(10)
    rows = _rows(db)
    assert [r.segment for r in rows] == ["completions", "support", "completions"]
    first, chat, private = rows
    assert unpack_ids(first.prompt_ids) == tiny_llm.encode_prompt("Hello there")
    assert len(unpack_ids(first.output_ids)) == first.output_tokens == 5
    assert first.prompt_text == "Hello there" and first.speculator_version == "builtin-ngram"
    assert first.latency_ms > 0 and 0 < first.ttft_ms <= first.latency_ms
    assert first.sampling["max_tokens"] == 5 and first.temperature == 0.0
    assert first.num_drafts >= 1 and first.accepted_per_position is not None
    assert unpack_ids(chat.prompt_ids) == tiny_llm.encode_chat(CHAT)
    assert private.opted_out and private.prompt_text is None and private.output_ids is None
    assert private.prompt_ids is None and private.output_tokens == 5 and private.num_drafts >= 1


def test_logged_output_ids_are_the_targets_even_past_a_stop_string(client, server, db):
    free = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 10,
                                                 "temperature": 0, "ignore_eos": True}).json()
    text = free["choices"][0]["text"]
    client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 10, "temperature": 0,
                                         "ignore_eos": True, "stop": [text[-4:]]})
    assert server.writer.flush(10)
    full, stopped = _rows(db)
    out_full, out_stop = unpack_ids(full.output_ids), unpack_ids(stopped.output_ids)
    assert out_stop == out_full[: len(out_stop)]  # a prefix of what the target produced
    assert stopped.finish_reason == "stop" and stopped.output_text == text[: text.find(text[-4:])]


def test_speculation_off_serves_target_only(tiny_llm, db):
    from fastapi.testclient import TestClient

    from autospec.serve.http import make_app

    from .helpers import make_server

    srv = make_server(tiny_llm, db, speculation="off")
    try:
        with TestClient(make_app(srv)) as c:
            r = c.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 6})
        assert r.headers["x-autospec-speculator"] == "off"
        assert r.json()["autospec"]["num_draft_tokens"] == 0
    finally:
        srv.close()


def test_every_answer_names_the_replica_that_served_it(server):
    from fastapi.testclient import TestClient

    from autospec.serve.app import replica_identity
    from autospec.serve.http import make_app
    from autospec.serve.http_io import parse_replica

    name = "id=r1; app=autospec; node=n1; host=h1"
    with TestClient(make_app(server, replica=name), raise_server_exceptions=False) as c:
        answers = [c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3}),
                   c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3,
                                                        "stream": True}),
                   c.post("/v1/completions", json={"prompt": "abc", "n": 2}),  # a 400
                   c.get("/health")]
    assert [r.status_code for r in answers] == [200, 200, 400, 200]
    assert {r.headers["x-autospec-replica"] for r in answers} == {name}
    assert answers[1].text.rstrip().endswith("data: [DONE]")
    assert parse_replica(name) == {"id": "r1", "app": "autospec", "node": "n1", "host": "h1"}
    outside = parse_replica(replica_identity())  # not in a Serve replica: the process
    assert outside["id"].startswith("pid") and outside["host"]


def test_no_replica_header_without_a_replica_name(client):
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2})
    assert r.status_code == 200 and "x-autospec-replica" not in r.headers
