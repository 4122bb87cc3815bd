"""Responses drafted by more than one version (a request in flight during an in-place swap
on vLLM: the ``autospec`` object's ``drafted_by`` names them), against a small fake
OpenAI-compatible server on a loopback port that answers as a vLLM deployment does across a
swap (the tiny native app swaps only between requests, so it never sends ``drafted_by``):
per-request rows carry ``drafted_by``, the summary counts the requests that straddled a
swap, each once, under its response's version."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autospec.cli import app

OLD, NEW = "suffix-demo-0001", "suffix-demo-0002"
# request i: (the response's version, its drafted_by, output tokens); the second straddled
ANSWERS = [(OLD, [], 4), (OLD, [OLD, NEW], 6), (NEW, [], 5), (NEW, None, 3)]  # None: no key


def _answer(i: int) -> tuple[str, dict[str, Any]]:
    version, drafted_by, tokens = ANSWERS[i % len(ANSWERS)]
    info: dict[str, Any] = {"version": version, "tau": 2.0, "num_drafts": 2,
                            "num_draft_tokens": 6, "num_accepted_tokens": 2,
                            "accepted_per_position": [1, 1, 0]}
    if drafted_by is not None:
        info["drafted_by"] = drafted_by
    usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}
    return version, {"usage": usage, "autospec": info}


class _Handler(BaseHTTPRequestHandler):
    count = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            i, type(self).count = type(self).count, type(self).count + 1
        version, extra = _answer(i)
        head = {"id": f"c{i}", "created": 0, "model": body["model"]}
        if body.get("stream"):
            text = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in (
                {**head, "object": "chat.completion.chunk", "choices": [{
                    "index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]},
                {**head, "object": "chat.completion.chunk", "choices": [], **extra},
            )) + "data: [DONE]\n\n"
            self._send(text, "text/event-stream", version)
        else:
            self._send(json.dumps({**head, "object": "chat.completion", "choices": [{
                "index": 0, "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop"}], **extra}), "application/json", version)

    def _send(self, text: str, kind: str, version: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("x-autospec-speculator", version)
        self.send_header("Content-Length", str(len(text.encode())))
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def swapping() -> Iterator[str]:
    """The fake deployment's URL; its answers follow :data:`ANSWERS` in arrival order."""
    handler = type("Handler", (_Handler,), {"count": 0, "lock": threading.Lock()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_requests_that_straddled_a_swap_are_counted_once_and_named(swapping, tmp_path: Path,
                                                                   stream: bool):
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(app, [
        "loadgen", "--url", swapping, "--model", "m", "--requests", "4", "--json", str(out),
        "--per-request", *(["--stream"] if stream else [])])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [r["drafted_by"] for r in data["results"]] == [[], [OLD, NEW], [], []]
    assert [r["version"] for r in data["results"]] == [OLD, OLD, NEW, NEW]
    assert data["straddled"] == 1
    by_version = data["by_version"]
    assert {v: (row["requests"], row["straddled"], row["completion_tokens"])
            for v, row in by_version.items()} == {OLD: (2, 1, 10), NEW: (2, 0, 8)}
    assert sum(row["completion_tokens"] for row in by_version.values()) \
        == data["completion_tokens"] == 18  # nothing counted twice
    assert "1 request(s) straddled a swap" in result.output
    assert "straddled" in result.output.split("by segment")[0]  # the by-version column
