"""The load loop and ``autospec loadgen`` against the real app on a loopback port (tiny
target, no Ray): bounded runs, segment headers reach the store, τ from the responses."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.loadgen import (
    DomainSource,
    Driver,
    LoadSpec,
    ReplaySource,
    Schedule,
    parse_schedule,
    run_load,
    summarize,
    tau,
)
from autospec.loadgen.client import Result


def _driver(url: str, **kw) -> Driver:  # type: ignore[no-untyped-def]
    return Driver(url, max_tokens=kw.pop("max_tokens", 8), timeout_s=60, **kw)


def test_request_bound_run_labels_segments_and_reports_tau(served):
    spec = LoadSpec(schedule=Schedule.constant({"support": 0.5, "coding": 0.5}),
                    concurrency=2, requests=8, seed=1)
    started = time.perf_counter()
    results = run_load(spec, DomainSource(seed=1), _driver(served.url))
    summary = summarize(results, time.perf_counter() - started)
    assert [r.index for r in results] == list(range(8))
    assert all(r.ok and r.version == "builtin-ngram" for r in results), results
    assert {r.replica for r in results} == {"id=loopback; host=test"}
    assert summary["requests"] == summary["ok"] == 8 and summary["errors"] == 0
    assert sum(v["requests"] for v in summary["by_segment"].values()) == 8
    steps = sum(r.num_drafts for r in results)
    assert steps > 0 and summary["tau"] == pytest.approx(
        (sum(r.num_accepted_tokens for r in results) + steps) / steps)
    deadline = time.monotonic() + 10
    while served.rows().get(None, 0) < 8 and time.monotonic() < deadline:
        time.sleep(0.1)
    from autospec import store

    with store.session_scope(served.db, readonly=True) as session:
        stats = store.live_tau(session, by_segment=True)
    assert {s.segment for s in stats} <= {"support", "coding"}
    assert sum(s.requests for s in stats) == 8


def test_rate_and_duration_bound_the_run(served):
    spec = LoadSpec(schedule=Schedule.constant({"json": 1.0}), concurrency=2, rate=4.0,
                    duration_s=1.5)
    started = time.perf_counter()
    results = run_load(spec, DomainSource(), _driver(served.url, max_tokens=2))
    took = time.perf_counter() - started
    # slots at 0, 0.25, ... 1.25 s: at most 6 requests start inside 1.5 s
    assert 1 <= len(results) <= 6
    assert all(r.start_s < 1.5 + 0.2 for r in results)
    assert took < 1.5 + 30


def test_schedule_shifts_the_domains_over_time(served):
    plan = parse_schedule("0:support=1;0.6:coding=1")
    spec = LoadSpec(schedule=plan, concurrency=1, rate=5.0, duration_s=1.6)
    results = run_load(spec, DomainSource(), _driver(served.url, max_tokens=1))
    early = {r.segment for r in results if r.start_s < 0.55}
    late = {r.segment for r in results if r.start_s > 0.65}
    assert early == {"support"} and late == {"coding"}


def test_stop_event_ends_a_long_run(served):
    stop = threading.Event()
    spec = LoadSpec(schedule=Schedule.constant({"support": 1.0}), duration_s=600, rate=2.0)
    threading.Timer(1.0, stop.set).start()
    started = time.perf_counter()
    run_load(spec, DomainSource(), _driver(served.url, max_tokens=1), stop=stop)
    assert time.perf_counter() - started < 60


def test_replay_through_the_completions_route(served, tmp_path: Path):
    path = tmp_path / "r.jsonl"
    path.write_text('"The quick brown fox"\n'
                    + json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                  "segment": "mine", "max_tokens": 3}) + "\n")
    spec = LoadSpec(schedule=Schedule.constant({"replay": 1.0}), requests=3)
    results = run_load(spec, ReplaySource(path), _driver(served.url, max_tokens=4))
    assert [r.segment for r in results] == ["replay", "mine", "replay"]
    assert all(r.ok for r in results)
    assert results[1].completion_tokens <= 3


def test_failed_requests_are_counted_not_raised(served):
    driver = _driver(served.url, model="no-such-model")
    spec = LoadSpec(schedule=Schedule.constant({"support": 1.0}), requests=2)
    results = run_load(spec, DomainSource(), driver)
    summary = summarize(results, 1.0)
    assert summary["errors"] == 2 and summary["ok"] == 0
    assert summary["error_kinds"] == {"NotFoundError 404": 2}


def test_tau_is_accepted_plus_one_per_step():
    rows = [Result(0, "a", 0, 1, True, num_drafts=4, num_accepted_tokens=6),
            Result(1, "a", 0, 1, True, num_drafts=6, num_accepted_tokens=4)]
    assert tau(rows) == pytest.approx((10 + 10) / 10)
    assert tau([]) is None


def test_loadgen_cli_writes_json_and_exits_zero(served, tmp_path: Path):
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(app, [
        "loadgen", "--url", served.url, "--requests", "3", "--mix", "support=1,coding=1",
        "--max-tokens", "4", "--concurrency", "2", "--json", str(out), "--per-request"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["requests"] == 3 and data["errors"] == 0 and len(data["results"]) == 3
    assert "τ" in result.output and "by segment" in result.output


def test_loadgen_cli_duration_takes_a_unit(served):
    started = time.monotonic()
    result = CliRunner().invoke(app, ["loadgen", "--url", served.url, "--duration", "0.03m",
                                      "--rate", "2", "--max-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert "within 1.8s" in result.output  # 0.03 minutes, not 0.03 seconds
    assert time.monotonic() - started >= 1.5


def test_loadgen_cli_usage_errors_and_unreachable(tmp_path: Path):
    runner = CliRunner()
    bad = runner.invoke(app, ["loadgen", "--mix", "poetry=1"])
    assert bad.exit_code == 2 and "unknown domain" in bad.output
    from tests.loadgen.conftest import free_port

    down = runner.invoke(app, ["loadgen", "--url", f"http://127.0.0.1:{free_port()}",
                               "--requests", "1", "--timeout", "5"])
    assert down.exit_code == 1 and "cannot reach" in down.output


@pytest.fixture
def keyed_served(tiny_llm, sqlite_url, monkeypatch):  # type: ignore[no-untyped-def]
    """A deployment requiring either of two keys, AUTOSPEC_API_KEY holding both (rotation)."""
    from autospec.settings import get_settings
    from tests.loadgen.conftest import serve

    monkeypatch.setenv("AUTOSPEC_API_KEY", "key-one-0123, key-two-4567")
    monkeypatch.delenv("AUTOSPEC_API_KEY_FILE", raising=False)
    get_settings.cache_clear()
    yield from serve(tiny_llm, sqlite_url, api_key="key-one-0123,key-two-4567")
    get_settings.cache_clear()


def test_loadgen_sends_the_first_of_several_keys_as_serve_reads_them(keyed_served,
                                                                     tmp_path: Path):
    """``AUTOSPEC_API_KEY=k1,k2`` (two keys during a rotation): loadgen sends k1, as demo and
    bench serve do, not the whole value (which the server answers with 401)."""
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(app, ["loadgen", "--url", keyed_served.url, "--requests", "2",
                                      "--max-tokens", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["requests"] == 2 and data["errors"] == 0, data
