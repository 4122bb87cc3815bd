"""``autospec bench serve --engine``'s figures and options (no engine is started here; the
real run is recorded in docs/vllm.md)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autospec.bench.prompts import BENCH_PROMPTS
from autospec.bench.serve_engines import Answer, _figures
from autospec.bench.serve_options import bench_prompts
from autospec.cli import app


def test_figures_give_tau_over_all_steps_and_median_per_request_speed() -> None:
    answers = [Answer(1.0, 40, "head", steps=20, accepted=19),
               Answer(2.0, 40, "head", steps=30, accepted=9),
               Answer(4.0, 40, "head", steps=39, accepted=0)]
    got = _figures(answers, wall_s=7.0)
    assert got["tau"] == pytest.approx((28 + 89) / 89)  # not the mean of per-request τ
    assert got["per_request_tok_s"] == 20.0 and got["throughput_tok_s"] == pytest.approx(120 / 7)
    assert got["versions"] == ["head"] and got["requests"] == 3
    assert _figures([Answer(1.0, 8, "off", 0, 0)], wall_s=1.0)["tau"] is None  # no step


def test_domain_prompts_replace_the_generic_ones_and_differ_from_the_demos() -> None:
    from autospec.workloads import domain_prompts

    support = bench_prompts("support")
    assert support is not None and len(support) == len(BENCH_PROMPTS)
    assert not set(map(str, support)) & set(map(str, domain_prompts("support", 64, seed=0)))
    assert bench_prompts(None) is None


@pytest.mark.parametrize(("args", "message"), [
    (["--engine", "tgi"], "--engine: unknown ['tgi']"),
    (["--engine", "vllm", "--domain", "poetry"], "--domain"),
    (["--engine", "vllm", "--concurrency", "1,0"], "is not a list of"),
    (["--engine", "vllm", "--concurrency", "4,4"], "is not a list of"),
    (["--engine", "vllm", "--k-bands", "1-2:9,3-:0"], "k must be between 0"),
    (["--engine", "vllm", "--vllm-option", "oops"], "expected KEY=VALUE"),
    (["--concurrency", "1,4"], "one value without --engine"),
    (["--k-bands", "1-:0"], "need --engine"),
    # options only the engines' bench reads: refused, no longer silently ignored
    (["--dtype", "bfloat16"], "--dtype: need --engine"),
    (["--dtype", "auto", "--deployment", "default"], "--dtype, --deployment: need --engine"),
    (["--database-url", "sqlite:////nowhere/x.db"], "--database-url: need --engine"),
    (["--domain", "support"], "--domain: need --engine"),
])
def test_bad_options_are_refused_before_anything_starts(args, message, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from autospec.bench import serve

    def ran(**kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the bench ran")
    monkeypatch.setattr(serve, "run_serve_bench", ran)
    done = CliRunner().invoke(app, ["bench", "serve", *args])
    assert done.exit_code == 2 and message in done.output, done.output


def test_the_batch_sender_sends_every_body_and_reads_each_answer() -> None:
    """Against a small local HTTP server answering in the API's shape."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from autospec.bench.serve import _batch
    from autospec.bench.serve_engines import _send

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = body["max_tokens"]
            data = json.dumps({"usage": {"completion_tokens": n},
                               "autospec": {"num_drafts": n - 1, "num_accepted_tokens": 2}})
            self.send_response(200)
            self.send_header("x-autospec-speculator", "head")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())

        def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        bodies = [{"max_tokens": n} for n in (5, 6, 7)]
        answers, wall = _batch(url, bodies, 2, _send)
        latencies, _ = _batch(url, bodies, 2)
    finally:
        server.shutdown()
    assert [(a.tokens, a.version, a.steps, a.accepted) for a in answers] == \
        [(5, "head", 4, 2), (6, "head", 5, 2), (7, "head", 6, 2)]
    assert wall > 0 and len(latencies) == 3 and all(t > 0 for t in latencies)


def _row(tok_s: float) -> dict:
    return {"requests": 4, "per_request_tok_s": tok_s / 2, "throughput_tok_s": tok_s,
            "versions": ["v"], "tau": 1.5}


def test_the_summary_says_where_speculation_stops_paying_and_if_bands_fix_it() -> None:
    from autospec.bench.serve_engines import _summarize

    phases = {1: {"vllm/spec": _row(30), "vllm/off": _row(20), "vllm/banded": _row(29)},
              4: {"vllm/spec": _row(50), "vllm/off": _row(60), "vllm/banded": _row(61)},
              8: {"vllm/spec": _row(70), "vllm/off": _row(90), "vllm/banded": _row(88)}}
    got = _summarize(["vllm"], ["spec", "off", "banded"], "t", "float32", 32, 5, "1-2:5,3-:0",
                     phases)
    assert got["ratios"]["vllm"]["1"] == {"spec": 1.5, "banded": 29 / 20}
    assert got["speculation_stops_paying_at"] == {"vllm": 4}
    assert got["banded_never_slower"] == {"vllm": False}  # 88 < 90 at 8 clients
    phases[8]["vllm/banded"] = _row(90)
    assert _summarize(["vllm"], ["spec", "off", "banded"], "t", "float32", 32, 5, "1-2:5,3-:0",
                      phases)["banded_never_slower"] == {"vllm": True}
    alone = _summarize(["vllm"], ["spec", "off"], "t", "float32", 32, 5, None,
                       {1: {"vllm/spec": _row(30), "vllm/off": _row(20)}})
    assert alone["speculation_stops_paying_at"] == {"vllm": None}
    assert "banded_never_slower" not in alone
    both = _summarize(["vllm"], ["spec", "off", "builtin"], "t", "float32", 32, 5, None,
                      {1: {"vllm/spec": _row(30), "vllm/off": _row(20), "vllm/builtin": _row(25)}})
    assert both["live_over_builtin"] == {"vllm": {"1": pytest.approx(1.2)}}
