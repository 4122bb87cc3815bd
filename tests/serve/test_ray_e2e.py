"""End to end through Ray Serve: the official ``openai`` client, hot-swap under load, and a
corrupt candidate. One local Ray + Serve instance for the module; each test deploys its own
application (own route prefix, own SQLite store, own data dir) and deletes it afterwards."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from autospec import store
from autospec.ports import free_port
from autospec.serve.kernel_caches import CACHE_VARS

from .helpers import promote, register_artifact

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def serve_url() -> Iterator[str]:
    ray = pytest.importorskip("ray")
    from ray import serve

    port = free_port()
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
             namespace="autospec-tests")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


class App:
    """One deployed application: its URL and its store."""

    def __init__(self, base: str, name: str, db: Any) -> None:
        self.url, self.name, self.db = f"{base}/{name}", name, db

    def openai(self):  # type: ignore[no-untyped-def]
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60)

    def rows(self) -> int:
        with store.session_scope(self.db, readonly=True) as session:
            return store.request_counts(session)[None]


@pytest.fixture
def deploy(serve_url: str, tmp_path: Path, sqlite_url: str) -> Iterator[Any]:
    from ray import serve

    from autospec.serve.app import build_app

    db = store.open_store(sqlite_url, upgrade=True)
    names: list[str] = []

    def _deploy(**config: Any) -> App:
        name = f"app{len(names)}-{int(time.time() * 1000) % 100000}"
        env = {"AUTOSPEC_DATA_DIR": str(tmp_path / "autospec-data")}
        config.setdefault("ray_actor_options", {"num_cpus": 0.5,
                                                "runtime_env": {"env_vars": env}})
        serve.run(build_app({"database_url": sqlite_url, **config}), name=name,
                  route_prefix=f"/{name}")
        names.append(name)
        return App(serve_url, name, db)

    yield _deploy
    for name in names:
        serve.delete(name)
    db.dispose()


def _check_openai_client(app: App, model: str) -> None:
    client = app.openai()
    raw = client.completions.with_raw_response.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    completion = raw.parse()
    version = raw.headers["x-autospec-speculator"]
    assert completion.model_extra["autospec"]["version"] == version
    assert completion.usage.completion_tokens <= 8 and completion.choices[0].finish_reason

    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
        temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.model_extra["autospec"]["num_drafts"] >= 1

    pieces, last = [], None
    for chunk in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
            temperature=0, stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        last = chunk
    assert "".join(pieces) == chat.choices[0].message.content
    assert last is not None and last.model_extra["autospec"]["version"] == version
    assert [m.id for m in client.models.list().data] == [model]


def test_openai_client_against_the_tiny_target(deploy, tiny_model_dir):
    app = deploy(target=str(tiny_model_dir), model_name="tiny", dtype="float32")
    _check_openai_client(app, "tiny")
    health = requests.get(f"{app.url}/health", timeout=10)
    assert health.status_code == 200
    assert health.json()["kernel_caches"] == {var: "64" for var in CACHE_VARS}
    assert "autospec:spec_decode_num_drafts_total" in requests.get(f"{app.url}/metrics").text
    for body in (b"\xff\xfe", b"{bad", json.dumps({"prompt": "x" * (2 << 20)}).encode()):
        r = requests.post(f"{app.url}/v1/completions", data=body, timeout=30)
        assert r.status_code in (400, 413) and "error" in r.json()


@pytest.mark.integration
def test_openai_client_against_the_default_target(deploy):
    app = deploy(target="smollm2-135m",
                 ray_actor_options={"num_cpus": 1})
    _check_openai_client(app, "smollm2-135m")


def _load(app: App, stop: threading.Event, out: list[dict[str, Any]], seed: int) -> None:
    session = requests.Session()
    i = 0
    while not stop.is_set():
        i += 1
        started = time.monotonic()
        try:
            r = session.post(f"{app.url}/v1/completions", timeout=60, json={
                "prompt": f"request {seed} {i}: one two three one two three", "max_tokens": 8,
                "temperature": 0.7 if i % 2 else 0, "seed": i, "stream": i % 3 == 0})
            ok = r.status_code == 200
            version = r.headers.get("x-autospec-speculator")
            if ok and i % 3 == 0:
                chunks = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
                ok = chunks[-1] == "[DONE]"
                body_version = json.loads(chunks[-2])["autospec"]["version"]
            elif ok:
                body_version = r.json()["autospec"]["version"]
            else:
                body_version = None
        except requests.RequestException as exc:
            ok, version, body_version = False, repr(exc), None
        out.append({"start": started, "end": time.monotonic(), "ok": ok,
                    "version": version, "body_version": body_version})


def test_hot_swap_under_load(deploy, tiny_model_dir, tiny_llm, tmp_path):
    app = deploy(target=str(tiny_model_dir), model_name="tiny", dtype="float32", replicas=2)
    register_artifact(app.db, tiny_llm, tmp_path, "swap-v1", "ngram")
    register_artifact(app.db, tiny_llm, tmp_path, "swap-v2", "draft")
    stop, results = threading.Event(), []
    threads = [threading.Thread(target=_load, args=(app, stop, results, n)) for n in range(4)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    moves = []
    for at, version in ((8, "swap-v1"), (18, "swap-v2")):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        promote(app.db, version)
        moves.append((time.monotonic(), version))
    time.sleep(max(0.0, t0 + 30 - time.monotonic()))
    stop.set()
    for t in threads:
        t.join()

    failed = [r for r in results if not r["ok"]]
    assert not failed, failed[:5]
    assert all(r["version"] == r["body_version"] for r in results)
    previous_versions = ["builtin-ngram", "swap-v1"]
    untils = [moves[1][0], float("inf")]
    assert all(r["version"] == "builtin-ngram" for r in results if r["end"] < moves[0][0])
    lags = []
    for (moved, version), previous, until in zip(moves, previous_versions, untils, strict=True):
        window = [r for r in results if moved <= r["start"] < until]
        late = [r["start"] - moved for r in window if r["version"] == previous]
        lags.append(max(late, default=0.0))
        assert all(r["version"] == version for r in window if r["start"] > moved + 10)
        assert any(r["version"] == version for r in window)
    assert max(lags) <= 10
    deadline = time.monotonic() + 30
    while app.rows() != len(results) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert app.rows() == len(results)
    print(f"\nhot-swap under load: {len(results)} requests, 0 failed, "
          f"swap lag (last old-version start after the move) {lags[0]:.2f}s / {lags[1]:.2f}s")


def test_a_corrupt_candidate_is_refused_and_recorded(deploy, tiny_model_dir, tiny_llm,
                                                      tmp_path):
    app = deploy(target=str(tiny_model_dir), model_name="tiny", dtype="float32", replicas=2)
    register_artifact(app.db, tiny_llm, tmp_path, "good", "ngram")
    bad = register_artifact(app.db, tiny_llm, tmp_path, "bad", "draft")
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")

    def versions(n: int) -> set[str]:
        out = set()
        for _ in range(n):
            r = requests.post(f"{app.url}/v1/completions", timeout=30,
                              json={"prompt": "hello", "max_tokens": 2})
            assert r.status_code == 200
            out.add(r.headers["x-autospec-speculator"])
        return out

    def reported() -> list[str]:  # what each replica says it serves (written at each swap)
        with store.session_scope(app.db, readonly=True) as session:
            return sorted(r.version for r in store.list_replicas(session, deployment="default"))

    promote(app.db, "good")
    deadline = time.monotonic() + 60
    while reported() != ["good", "good"]:  # both replicas, not only the ones requests hit
        assert time.monotonic() < deadline, f"replicas report {reported()}"
        time.sleep(0.2)
    assert versions(4) == {"good"}
    promote(app.db, "bad")

    def failures() -> list:  # type: ignore[type-arg]
        with store.session_scope(app.db, readonly=True) as session:
            return store.list_events(session, kinds=["failure"])

    deadline = time.monotonic() + 60
    while len(failures()) < 2:  # each replica polls and refuses it
        assert time.monotonic() < deadline, f"refusals audited: {len(failures())} of 2"
        time.sleep(0.2)
    time.sleep(4)  # several more polls on every replica
    assert versions(12) == {"good"}
    events = failures()
    assert len(events) == 2  # one per replica, not one per poll
    assert {e.version for e in events} == {"bad"} and "sha256" in events[0].reason
    assert requests.get(f"{app.url}/health", timeout=10).status_code == 200
    with store.session_scope(app.db, readonly=True) as session:  # what `status` reads
        reports = store.list_replicas(session, deployment="default")
        served = store.get_deployment(session, name="default")
        assert [r.version for r in reports] == ["good", "good"]  # not the pointer's "bad"
        assert (served.target_id, served.dtype) == (tiny_llm.info.target_id, "float32")


def test_overload_through_ray_is_always_an_openai_503(deploy, tiny_model_dir):
    """120 requests at once against one replica with the serving defaults (the issue's
    burst): every refusal is the replica's JSON 503 with Retry-After, none Ray's text/plain."""
    from .test_overload import assert_overload_answer

    app = deploy(target=str(tiny_model_dir), model_name="tiny", dtype="float32")
    n = 120
    start, answers = threading.Barrier(n), []

    def one(i: int) -> None:
        start.wait()
        r = requests.post(f"{app.url}/v1/completions", timeout=300, json={
            "prompt": f"load {i}", "max_tokens": 200, "ignore_eos": True})
        answers.append((r.status_code, r.headers, r.content))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [a for a in answers if a[0] != 200]
    assert len(answers) == n and refused  # the burst did overload the replica
    for status, headers, body in refused:
        assert_overload_answer(status, headers, body)
    print(f"\noverload through Ray: {n - len(refused)} served, {len(refused)} OpenAI-shaped 503")


def test_one_metrics_scrape_covers_every_replica(deploy, tiny_model_dir):
    from prometheus_client.parser import text_string_to_metric_families

    from autospec.serve.http_io import parse_replica

    app = deploy(target=str(tiny_model_dir), model_name="tiny", dtype="float32", replicas=2)
    served: set[str] = set()

    def one() -> None:
        r = requests.post(f"{app.url}/v1/completions", timeout=60,
                          json={"prompt": "hello", "max_tokens": 4})
        assert r.status_code == 200
        served.add(parse_replica(r.headers["x-autospec-replica"])["id"])

    deadline = time.monotonic() + 60
    while len(served) < 2:
        assert time.monotonic() < deadline, served
        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def scraped() -> dict[str, float]:
        text = requests.get(f"{app.url}/metrics", timeout=10).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        return {s.labels.get("replica", "?"): s.value
                for s in families["autospec:generation_tokens"].samples
                if s.name.endswith("_total")}

    deadline = time.monotonic() + 30
    while set(scraped()) != served:  # each replica sends its metrics every 2 s
        assert time.monotonic() < deadline, (scraped(), served)
        time.sleep(0.5)
    assert all(v >= 4 for v in scraped().values())
    own = requests.get(f"{app.url}/metrics?scope=replica", timeout=10).text
    assert 'replica="' not in own and "autospec:generation_tokens_total" in own
