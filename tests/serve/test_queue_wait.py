"""Queue-age shedding (issue 28): a request that waits ``max_queue_wait_s`` in a replica's
queue without starting is answered with the declared-overload 503 (``Retry-After``), counted
in ``autospec:request_rejected_total{reason="queue_wait"}``, and never decoded; the request
decoding meanwhile is not affected. The decode thread is held by a stand-in slow target (its
forward waits on a gate), so the bound passes while the second request waits — whatever the
machine's speed: nothing here is timed."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from autospec.bench.soak.load import _error_kind
from autospec.serve.http import make_app
from autospec.serve.requests import Overloaded
from autospec.serve.server import LLMServer

from .helpers import make_server
from .test_abandon import Client, _rows, _until

BODY = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture
def held_server(tiny_llm, db, monkeypatch) -> Iterator[tuple[LLMServer, list[int], Any]]:  # type: ignore[no-untyped-def]
    """A replica whose decode thread stops at its first forward until ``gate`` is set; the
    list counts forwards (a request never decoded adds none)."""
    gate = threading.Event()
    forwards: list[int] = []
    real = tiny_llm.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        forwards.append(1)
        assert gate.wait(60), "the test never released the decode thread"
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny_llm, "forward", forward)
    srv = make_server(tiny_llm, db, speculation="off", max_queue_wait_s=0.2)
    yield srv, forwards, gate
    gate.set()
    srv.close()


def _rejected(server: LLMServer, reason: str) -> float:
    value = server.metrics.registry.get_sample_value("autospec:request_rejected_total",
                                                     {"reason": reason})
    return value or 0.0


def _answer(client: Client) -> tuple[int | None, dict[str, str], bytes]:
    start = next(m for m in client.sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in client.sent if m["type"] == "http.response.body")
    return client.status, headers, body


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_request_queued_past_the_bound_gets_a_503_and_is_never_decoded_tiny(
        held_server, db, stream: bool) -> None:
    server, forwards, gate = held_server
    app = make_app(server)

    async def scenario() -> tuple[Client, Client]:
        first = Client(app, "/v1/completions", BODY)
        await _until(lambda: len(forwards) == 1)  # decoding, held at its first forward
        queued = Client(app, "/v1/completions", BODY | {"stream": stream})
        await asyncio.wait_for(queued.task, 30)  # answered while the thread is still held
        assert len(forwards) == 1 and server.health()["pending"] == 1
        gate.set()
        await asyncio.wait_for(first.task, 30)
        return first, queued

    first, queued = asyncio.run(scenario())
    status, headers, body = _answer(queued)
    assert status == 503 and int(headers["retry-after"]) >= 1
    error = json.loads(body)["error"]
    assert error["type"] == "overloaded_error" and error["code"] == "overloaded"
    assert "max_queue_wait_s" in error["message"]
    assert _error_kind(status, headers.get("retry-after")) == "overload_503"  # the soak's
    assert _rejected(server, "queue_wait") == 1 and _rejected(server, "pending_limit") == 0
    # the request that was decoding all along is answered in full, and only it is logged
    assert first.status == 200 and json.loads(_answer(first)[2])["choices"][0]["text"]
    assert _rows(server, db) == 1
    assert server.health()["pending"] == 0


def test_the_decode_thread_sheds_a_job_that_reaches_it_too_late_tiny(tiny_llm, db) -> None:
    """The other path: a job the thread picks up after the bound (the event loop late with its
    timer) is shed there, not decoded."""
    server = make_server(tiny_llm, db, max_queue_wait_s=5)
    try:
        late, on_time = server.admit(), server.admit()
        late.admitted -= 10  # it has waited 10 s
        with pytest.raises(Overloaded, match=r"waited 10\.\ds in this replica's queue"):
            server.begin(late)
        assert late.state == "shed" and server.health()["pending"] == 1
        assert server.begin(late) is False  # it left the queue once, for good
        assert server.begin(on_time) is True
        assert server.shed(on_time) is None  # a running request is never shed
        server.end(on_time)
        assert server.health()["pending"] == 0 and _rejected(server, "queue_wait") == 1
    finally:
        server.close()


def test_zero_means_no_bound_tiny(tiny_llm, db) -> None:
    server = make_server(tiny_llm, db, max_queue_wait_s=0)
    try:
        job = server.admit()
        job.admitted -= 1e6
        assert server.queue_wait_left(job) is None and server.begin(job) is True
        server.end(job)
    finally:
        server.close()
