"""``autospec bench serve --engine vllm --vllm-suffix``: vLLM's own ``suffix`` method
(arctic-inference) served beside the live version; its options, its summary (no engine is
started here; the real run is recorded in docs/vllm.md)."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from autospec.bench.serve_engines import ARCTIC_LABEL, _summarize, arctic_options, engine_modes
from autospec.cli import app


def _row(tok_s: float) -> dict:
    return {"requests": 4, "per_request_tok_s": tok_s / 2, "throughput_tok_s": tok_s,
            "versions": ["v"], "tau": 1.5}


def test_vllm_suffix_is_served_on_vllm_only_with_vllms_suffix_method() -> None:
    modes = ["spec", "off", "builtin", "arctic"]
    assert engine_modes("vllm", modes) == modes
    assert engine_modes("native", modes) == ["spec", "off", "builtin"]
    assert arctic_options(5) == {"speculative_config": {"method": "suffix",
                                                        "num_speculative_tokens": 5}}
    assert arctic_options(3, 0)["speculative_config"] == {
        "method": "suffix", "num_speculative_tokens": 3,
        "suffix_decoding_max_cached_requests": 0}


def test_the_summary_gives_the_live_version_over_vllms_suffix_and_ngram() -> None:
    phases = {1: {"vllm/spec": _row(30), "vllm/off": _row(20), "vllm/builtin": _row(25),
                  "vllm/arctic": _row(24), "native/spec": _row(10), "native/off": _row(8),
                  "native/builtin": _row(9)},
              4: {"vllm/spec": _row(60), "vllm/off": _row(50), "vllm/builtin": _row(50),
                  "vllm/arctic": _row(75), "native/spec": _row(12), "native/off": _row(10),
                  "native/builtin": _row(11)}}
    got = _summarize(["vllm", "native"], ["spec", "off", "builtin", "arctic"], "t", "float32",
                     32, 5, None, phases)
    assert got["live_over_vllm_suffix"] == {"1": pytest.approx(1.25), "4": pytest.approx(0.8)}
    assert got["live_over_builtin"]["vllm"] == {"1": pytest.approx(1.2), "4": pytest.approx(1.2)}
    assert "arctic" not in got["ratios"]["native"]["1"]
    assert set(got["vllm_over_native"]["1"]) == {"spec", "off", "builtin"}
    assert "live_over_vllm_suffix" not in _summarize(
        ["vllm"], ["spec", "off"], "t", "float32", 32, 5, None,
        {1: {"vllm/spec": _row(30), "vllm/off": _row(20)}})
    assert "arctic" in ARCTIC_LABEL


@pytest.mark.parametrize(("args", "message"), [
    (["--vllm-suffix"], "needs --engine vllm"),
    (["--engine", "native", "--vllm-suffix"], "needs --engine vllm"),
    (["--engine", "vllm", "--vllm-suffix-cache", "0"], "needs --vllm-suffix"),
    (["--vllm-suffix-cache", "0"], "needs --vllm-suffix"),
    (["--engine", "vllm", "--vllm-suffix-warm", "5"], "needs --vllm-suffix and --database-url"),
])
def test_vllm_suffix_without_the_vllm_engine_is_refused(args, message) -> None:  # type: ignore[no-untyped-def]
    done = CliRunner().invoke(app, ["bench", "serve", *args])
    assert done.exit_code == 2 and message in done.output


def test_vllm_suffix_without_arctic_inference_says_what_to_install(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "arctic_inference" else real(name, *a))
    done = CliRunner().invoke(app, ["bench", "serve", "--engine", "vllm", "--vllm-suffix"])
    assert done.exit_code == 2 and "arctic-inference is not installed" in done.output
    assert "docs/vllm.md" in done.output


def test_the_warm_up_replays_the_stores_newest_logged_requests(sqlite_url) -> None:  # type: ignore[no-untyped-def]
    from autospec import store
    from autospec.bench.arctic_warm import warm_bodies

    engine = store.open_store(sqlite_url, upgrade=True)
    store.write_requests(engine, [store.RequestRecord(prompt_ids=[i, i + 1], output_ids=[7] * i)
                                  for i in range(1, 5)])
    engine.dispose()
    assert warm_bodies(sqlite_url, 2) == [
        {"prompt": [3, 4], "max_tokens": 3, "temperature": 0},
        {"prompt": [4, 5], "max_tokens": 4, "temperature": 0}]


def test_fresh_rounds_never_repeat_a_prompt_and_fixed_rounds_repeat_the_set() -> None:
    from autospec.bench.serve_engines import fresh_pool_size, round_batches

    pool = [{"messages": [{"role": "user", "content": str(i)}]} for i in range(60)]
    assert fresh_pool_size(2, [1, 4, 8]) == 2 * 6 + 2 * 8 + 2 * 16 == 60
    seen, start = [], 0
    for clients in (1, 4, 8):
        batches = round_batches(pool, 2, clients, fresh=True, start=start)
        assert [len(b) for b in batches] == [max(6, 2 * clients)] * 2
        start += sum(map(len, batches))
        seen += [b["messages"][0]["content"] for batch in batches for b in batch]
    assert len(seen) == len(set(seen)) == 60
    fixed = round_batches(pool[:6], 3, 8)
    assert len(fixed) == 3 and fixed[0] == fixed[2] and len(fixed[0]) == 18


def test_fresh_rounds_refuse_a_pool_too_small() -> None:
    from autospec.bench.serve_engines import round_batches

    with pytest.raises(ValueError, match="too few"):
        round_batches([{"messages": []}] * 10, 2, 4, fresh=True)


@pytest.mark.parametrize(("args", "message"), [
    (["--engine", "vllm", "--fresh-prompts"], "needs --domain"),
    (["--fresh-prompts"], "--fresh-prompts: need"),
])
def test_fresh_prompts_need_the_engine_bench_and_a_domain(args, message) -> None:  # type: ignore[no-untyped-def]
    done = CliRunner().invoke(app, ["bench", "serve", *args])
    assert done.exit_code == 2 and message in done.output


def test_speculation_stops_paying_at_the_lowest_losing_load_whatever_the_order_given() -> None:
    """``--concurrency 8,1,4``: the phases come in the order given; the answer is the
    lowest client count where speculation loses (4), not the first one measured (8)."""
    phases = {c: {"vllm/spec": _row(spec), "vllm/off": _row(10)}
              for c, spec in ((8, 5), (1, 20), (4, 8))}
    got = _summarize(["vllm"], ["spec", "off"], "t", "float32", 32, 5, None, phases)
    assert got["speculation_stops_paying_at"] == {"vllm": 4}
