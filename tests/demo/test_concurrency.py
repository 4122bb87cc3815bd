"""The demo's concurrency table (spec on/off per load on vLLM): built from given figures,
measured by the bench's own function against a small local HTTP server, and called by the
demo only when it serves on vLLM (no Ray, no model: the runner's seams are fakes)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from autospec.demo.concurrency import (
    concurrency_lines,
    concurrency_rows,
    concurrency_summary,
    measure_concurrency,
)
from autospec.demo.plan import plan_for
from autospec.demo.report import write_markdown
from autospec.demo.run import Demo


def _fig(tok_s: float, tau: float | None = 1.6, version: str = "suffix-0002") -> dict[str, Any]:
    return {"requests": 8, "per_request_tok_s": tok_s / 3, "throughput_tok_s": tok_s,
            "versions": [version], "tau": tau}


def test_the_table_gives_on_over_off_per_load_and_where_speculation_stops_paying() -> None:
    phases = {4: {"vllm/spec": _fig(48.0), "vllm/off": _fig(40.0, None, "off")},
              1: {"vllm/spec": _fig(30.0, 1.8), "vllm/off": _fig(20.0, None, "off")},
              8: {"vllm/spec": _fig(45.0), "vllm/off": _fig(50.0, None, "off")}}
    table = concurrency_summary(phases)
    assert [r["clients"] for r in table["rows"]] == [1, 4, 8]
    assert [r["on_over_off"] for r in table["rows"]] == pytest.approx([1.5, 1.2, 0.9])
    assert table["stops_paying_at"] == 8
    assert concurrency_rows(table)[0] == ["1", "suffix-0002", "1.80", "30.0", "20.0", "1.50×"]
    del phases[8]
    assert concurrency_summary(phases)["stops_paying_at"] is None


def test_the_report_section_says_where_speculation_stops_paying() -> None:
    table = {"domain": "support", "rounds": 1, "max_tokens": 40, **concurrency_summary(
        {1: {"vllm/spec": _fig(30.0), "vllm/off": _fig(20.0, None, "off")},
         4: {"vllm/spec": _fig(30.0), "vllm/off": _fig(40.0, None, "off")}})}
    text = "\n".join(concurrency_lines(table))
    assert "## Speculation at the load served (vLLM)" in text
    assert "speculation stops paying at 4 clients" in text
    assert "| 4 | suffix-0002 | 1.60 | 30.0 | 40.0 | 0.75× |" in text
    assert concurrency_lines(None) == []


def _server(version: str, seen: list[dict[str, Any]]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            drafted = version != "off"
            data = json.dumps({"usage": {"completion_tokens": body["max_tokens"]},
                               "autospec": {"num_drafts": 4 if drafted else 0,
                                            "num_accepted_tokens": 2 if drafted else 0}})
            self.send_response(200)
            self.send_header("x-autospec-speculator", version)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_measuring_sends_the_domain_prompts_to_both_apps_at_each_load() -> None:
    spec_seen: list[dict[str, Any]] = []
    off_seen: list[dict[str, Any]] = []
    spec, off = _server("suffix-0002", spec_seen), _server("off", off_seen)
    said: list[str] = []
    try:
        table = measure_concurrency(
            live_url=f"http://127.0.0.1:{spec.server_address[1]}",
            baseline_url=f"http://127.0.0.1:{off.server_address[1]}", domain="support",
            clients=(1, 4), rounds=2, max_tokens=16, model="demo", say=said.append)
    finally:
        spec.shutdown()
        off.shutdown()
    assert [r["clients"] for r in table["rows"]] == [1, 4]
    assert table["rows"][0]["version"] == "suffix-0002"
    assert table["rows"][0]["tau"] == pytest.approx(1.5)  # (4 steps + 2 accepted) / 4
    # 1 client: 6 prompts × 2 rounds; 4 clients: ≥ 2 requests each (12) × 2 rounds
    assert len(spec_seen) == len(off_seen) == 12 + 24
    assert all(b["model"] == "demo" and b["max_tokens"] == 16 and b["temperature"] == 0
               for b in spec_seen + off_seen)
    assert said and "1, 4 clients" in said[0]


@pytest.fixture
def story_without_serving(monkeypatch):  # type: ignore[no-untyped-def]
    """The demo's story with fake apps, no controller; counts the concurrency calls."""
    from tests.demo.test_partial import FakeDriver

    calls: list[str] = []

    def start(self) -> None:
        self.live, self.baseline = FakeDriver(), FakeDriver()

    monkeypatch.setattr(Demo, "_start_serving", start)
    monkeypatch.setattr(Demo, "_stop_serving", lambda self: None)
    monkeypatch.setattr(Demo, "_load_target", lambda self: None)
    monkeypatch.setattr(Demo, "_shadow_tau", lambda self, phase, n: None)
    monkeypatch.setattr(Demo, "_wait_logged", lambda self, timeout_s=30.0: None)
    monkeypatch.setattr(Demo, "_cycle", lambda self, after: None)
    monkeypatch.setattr(Demo, "_wait_for_segments", lambda self: None)
    monkeypatch.setattr(Demo, "_segment_shadow", lambda self, phase, versions: {})
    monkeypatch.setattr(Demo, "_watch", lambda self, after, window_s, quiet=False:
                        SimpleNamespace(action="none"))

    def concurrency(self) -> dict[str, Any]:
        calls.append(self.plan.engine)
        return {"domain": self.plan.domain_b, "rounds": 1, "max_tokens": 8, **concurrency_summary(
            {1: {"vllm/spec": _fig(30.0), "vllm/off": _fig(20.0, None, "off")}})}

    monkeypatch.setattr(Demo, "_concurrency", concurrency)
    return calls


@pytest.mark.parametrize("engine", ["native", "vllm"])
def test_the_demo_measures_the_table_only_on_vllm(story_without_serving, engine: str,
                                                  tmp_path: Path) -> None:
    plan = plan_for("quick").with_overrides(requests_per_phase=2).on_engine(engine)
    result = Demo(plan, data_dir=tmp_path / "data").run()
    assert story_without_serving == ([engine] if engine == "vllm" else [])
    assert (result.concurrency is not None) == (engine == "vllm")
    assert ("concurrency" in result.as_dict()) and (
        result.as_dict()["concurrency"] == result.concurrency)
    write_markdown(result, tmp_path / "report.md", None)
    report = (tmp_path / "report.md").read_text()
    assert ("Speculation at the load served" in report) == (engine == "vllm")
