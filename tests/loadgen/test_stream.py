"""Streamed requests (``Driver(stream=True)``, ``autospec loadgen --stream``) against the real
app on a loopback port (tiny target): the same answer as a whole request, plus the time to
first token, and rates after it (:func:`autospec.loadgen.client.decode_rate`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.loadgen import DomainSource, Driver
from autospec.loadgen.client import Result, decode_rate


def _pair(url: str, prompt, **kw):  # type: ignore[no-untyped-def]
    whole = Driver(url, max_tokens=8, timeout_s=60, keep_text=True, **kw)
    streamed = Driver(url, max_tokens=8, timeout_s=60, keep_text=True, stream=True, **kw)
    return whole.send(prompt), streamed.send(prompt)


@pytest.mark.parametrize("domain", ["support", "replay-completion"])
def test_a_streamed_request_reads_as_the_whole_one_plus_its_first_token_time(served, domain):
    from autospec.loadgen.source import Prompt

    prompt = (DomainSource(seed=3).next("support") if domain == "support"
              else Prompt(segment="replay", prompt="The quick brown fox"))
    whole, streamed = _pair(served.url, prompt)
    assert whole.ok and streamed.ok, (whole, streamed)
    assert whole.ttft_s is None
    assert streamed.ttft_s is not None and 0 < streamed.ttft_s <= streamed.latency_s
    for field in ("text", "completion_tokens", "prompt_tokens", "version", "num_drafts",
                  "num_accepted_tokens", "tau", "replica"):  # greedy: the same decode
        assert getattr(streamed, field) == getattr(whole, field), field
    assert streamed.completion_tokens > 1 and streamed.num_drafts > 0


def test_a_failed_stream_is_a_failed_result_not_an_exception(served):
    driver = Driver(served.url, model="no-such-model", stream=True, timeout_s=60)
    result = driver.send(DomainSource().next("support"))
    assert not result.ok and result.error == "NotFoundError 404"


def test_decode_rate_leaves_the_first_token_out_where_every_result_has_its_time():
    streamed = [Result(0, "a", 0, 2.0, True, completion_tokens=11, ttft_s=1.0),
                Result(1, "a", 0, 1.5, True, completion_tokens=6, ttft_s=0.5)]
    assert decode_rate(streamed) == pytest.approx((10 + 5) / (1.0 + 1.0))
    empty = [*streamed, Result(2, "a", 0, 1.0, True, completion_tokens=0)]  # no text
    assert decode_rate(empty) == pytest.approx((10 + 5) / (1.0 + 1.0))  # left out
    whole = [Result(0, "a", 0, 2.0, True, completion_tokens=11),
             Result(1, "a", 0, 1.5, True, completion_tokens=6)]
    assert decode_rate(whole) == pytest.approx(17 / 3.5)  # not streamed: whole requests
    assert decode_rate([]) is None


def test_loadgen_cli_stream_reports_the_time_to_first_token(served, tmp_path: Path):
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(app, [
        "loadgen", "--url", served.url, "--requests", "2", "--max-tokens", "4", "--stream",
        "--json", str(out), "--per-request"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["errors"] == 0 and data["ttft_p50_ms"] > 0 and data["decode_tokens_per_s"] > 0
    assert all(r["ttft_s"] is not None for r in data["results"])
    assert "time to first token" in result.output
    plain = CliRunner().invoke(app, ["loadgen", "--url", served.url, "--requests", "1",
                                     "--max-tokens", "2", "--json", str(out)])
    assert plain.exit_code == 0 and json.loads(out.read_text())["ttft_p50_ms"] is None
