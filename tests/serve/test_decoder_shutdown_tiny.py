"""The native decoder shutting down on the tiny target: every request it admitted ends. One
admitted before the replica closed but handed to the decode thread after (a stream read
later, or a ``close`` on another thread between admission and hand-over) is refused with
the replica's 503 "shutting down" and leaves the queue; it was a 500 (the executor's
``RuntimeError``) that stayed admitted for ever. Requests decoding or queued when ``close``
starts are finished by it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from autospec.serve.errors import APIError
from autospec.serve.requests import Served
from autospec.serve.schemas import CompletionRequest
from autospec.serve.server import LLMServer, RequestContext

from .helpers import make_server, slowed_forwards

STEP_S = 0.005


@pytest.fixture
def slow_server(tiny_llm, monkeypatch) -> Iterator[tuple[LLMServer, list[float]]]:  # type: ignore[no-untyped-def]
    """Target-only decoding at >= 5 ms per step, no store; the list holds each forward's
    time."""
    forwards = slowed_forwards(tiny_llm, monkeypatch, STEP_S)
    srv = make_server(tiny_llm, None, speculation="off", log_traffic=False)
    yield srv, forwards
    srv.close()


async def _prepared(server: LLMServer, max_tokens: int = 5) -> Any:
    req = CompletionRequest(prompt="hello", max_tokens=max_tokens, temperature=0,
                            ignore_eos=True)
    return await server.prepare_completion(req, RequestContext("completions", "x"))


def _gauges(server: LLMServer) -> tuple[float | None, float | None, int]:
    value = server.metrics.registry.get_sample_value
    return (value("autospec:num_requests_waiting"), value("autospec:num_requests_running"),
            server.health()["pending"])


def _refused(exc: pytest.ExceptionInfo[APIError]) -> None:
    assert exc.value.status == 503 and "shutting down" in str(exc.value), exc.value


def test_a_stream_read_after_the_replica_closed_is_refused_tiny(slow_server) -> None:  # type: ignore[no-untyped-def]
    server, forwards = slow_server

    async def scenario() -> None:
        streamed = server.stream(await _prepared(server))  # admitted
        server.close()  # before the response body is read
        with pytest.raises(APIError) as exc:
            async for _ in streamed:
                pass
        _refused(exc)
        assert _gauges(server) == (0.0, 0.0, 0)
        streamed.abandon()  # the client then goes: nothing left to free

    asyncio.run(scenario())
    assert forwards == []


def test_a_request_admitted_as_the_decoder_closes_is_refused_tiny(slow_server) -> None:  # type: ignore[no-untyped-def]
    server, forwards = slow_server

    async def scenario() -> None:
        prepared = await _prepared(server)
        server.decoder.close()  # another thread's close(), between admission and hand-over
        with pytest.raises(APIError) as exc:
            await server.generate(prepared)
        _refused(exc)
        assert _gauges(server) == (0.0, 0.0, 0)

    asyncio.run(scenario())
    assert forwards == []


def test_close_finishes_the_decoding_and_the_queued_requests_tiny(slow_server) -> None:  # type: ignore[no-untyped-def]
    server, forwards = slow_server

    async def scenario() -> list[Any]:
        tasks = [asyncio.ensure_future(server.generate(await _prepared(server, 20)))
                 for _ in range(3)]
        while len(forwards) < 3:  # the first decodes, two wait
            await asyncio.sleep(0.005)
        closer = threading.Thread(target=server.close)
        closer.start()  # a stop mid-step, from another thread (a replica's teardown)
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        closer.join(timeout=60)
        assert not closer.is_alive()
        return done

    done = asyncio.run(scenario())
    assert all(isinstance(s, Served) and s.result.finish_reason == "length" for s in done), done
    assert _gauges(server) == (0.0, 0.0, 0)
