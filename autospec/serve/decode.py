"""How a replica's requests are decoded: the server (:mod:`autospec.serve.server`) holds one
:class:`Decoder`, chosen by its engine.

- :class:`ThreadDecoder` (``native``): the engine decodes one request at a time,
  synchronously, on the CPU or GPU. The decoder owns one decode thread (a single-worker
  executor); requests queue for it while the event loop stays free for other requests,
  health checks and metrics. A request whose client goes stops after its current step; one
  still queued when the replica's ``max_queue_wait_s`` passes is shed (a 503, never
  decoded: :func:`within_queue_bound`). Closing finishes the request decoding and those
  queued; one admitted before the replica closed that reaches the thread after is refused
  (the replica's 503 "shutting down"), so every admitted request ends.
- :class:`~autospec.serve.vllm_decode.VllmDecoder` (``vllm``): vLLM batches every admitted
  request; its outputs come back on the event loop.

A decoder admits through the server (:class:`Replica`: its pending limit, its load, its
report) and says what its engine serves beyond one plain choice (``serves_choices``: n > 1 and
log-probabilities) and what a traffic row adds (:meth:`Decoder.record`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from autospec.engine.generate import SpeculativeEngine
from autospec.engine.interface import Engine
from autospec.serve.errors import APIError
from autospec.serve.metrics import ServeMetrics
from autospec.serve.requests import Job, Overloaded, Prepared, Served, Streamed
from autospec.serve.versions import ServedVersion

log = logging.getLogger(__name__)

T = TypeVar("T")


class Replica(Protocol):
    """What a decoder needs of the server it decodes for."""

    metrics: ServeMetrics

    def admit(self) -> Job: ...

    def begin(self, job: Job) -> bool: ...

    def queue_wait_left(self, job: Job) -> float | None: ...

    def shed(self, job: Job) -> Overloaded | None: ...

    def end(self, job: Job) -> None: ...

    def abandon(self, job: Job) -> None: ...

    def refuse(self, job: Job) -> APIError: ...

    def concurrency(self, job: Job) -> float: ...

    def k_for(self, job: Job, version: ServedVersion) -> int: ...

    def report(self, p: Prepared, s: Served) -> None: ...


class Decoder(Protocol):
    """How requests run on one kind of engine."""

    #: whether the engine serves n > 1 choices and log-probabilities
    serves_choices: bool

    def attach(self, metrics: ServeMetrics) -> None:
        """The replica's metrics are ``metrics``: add the engine's own series to them."""
        ...

    async def generate(self, replica: Replica, p: Prepared) -> Served:
        """Admit ``p`` and decode it to the end (reported); a cancelled caller (client gone)
        stops it, and it is not logged."""
        ...

    def stream(self, replica: Replica, p: Prepared) -> Streamed:
        """Admit ``p`` now (an overload raises here); it decodes as the result is iterated:
        each step's new token ids, then the :class:`Served` request."""
        ...

    def record(self, p: Prepared, s: Served) -> dict[str, Any]:
        """What the traffic row's ``sampling`` adds for this engine (empty: nothing)."""
        ...

    def close(self) -> None:
        """Finish what is queued (the replica is shutting down)."""
        ...


async def within_queue_bound(replica: Replica, job: Job, work: Awaitable[T]) -> T:
    """``work``'s result (what ``job`` yields first); if ``job`` is still waiting to start
    when the replica's queue bound passes, it is shed now — :class:`Overloaded` raised, its
    client answered a 503 while the decode thread is still busy — and never decoded."""
    left = replica.queue_wait_left(job)
    if left is None:
        return await work
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, left))
        if not done and (refusal := replica.shed(job)) is not None:
            raise refusal
        return await task  # it started in time: it finishes as it would have
    finally:
        if not task.done():  # shed, or the caller was cancelled (client gone)
            task.cancel()


def native_engine(engine: Engine) -> SpeculativeEngine:
    """``engine`` as the native engine a :class:`ThreadDecoder` runs (a clear error if a
    replica was put together with another engine's versions)."""
    if not isinstance(engine, SpeculativeEngine):
        raise TypeError(f"the native decoder runs autospec's engine, not {engine.name!r}")
    return engine


class ThreadDecoder:
    """The native engine's requests, one at a time on the replica's decode thread."""

    serves_choices = False

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autospec-decode")

    def attach(self, metrics: ServeMetrics) -> None:
        """Nothing to add: the native engine's figures are autospec's own series."""

    def close(self) -> None:
        """Finish the request decoding and those queued; a request admitted before the
        replica closed that comes to the thread after this is refused (:meth:`_submit`)."""
        self._thread.shutdown(wait=True)

    def _submit(self, replica: Replica, job: Job, fn: Callable[..., T],
                *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on the decode thread; once it is closed, ``job`` leaves the queue
        and the replica's 503 "shutting down" is raised (the executor's RuntimeError was a
        500, and the job stayed admitted for ever)."""
        try:
            return asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            raise replica.refuse(job) from None

    def record(self, p: Prepared, s: Served) -> dict[str, Any]:
        return {}

    async def generate(self, replica: Replica, p: Prepared) -> Served:
        job = replica.admit()
        work = self._submit(replica, job, self._decode, replica, p, job, None)
        try:
            served = await within_queue_bound(replica, job, work)
        except asyncio.CancelledError:
            replica.abandon(job)
            raise
        assert served is not None
        return served

    def stream(self, replica: Replica, p: Prepared) -> Streamed:
        """If the consumer stops early, or :meth:`Streamed.abandon` is called (client gone,
        even before iterating), the request leaves the queue or stops after its step."""
        job = replica.admit()
        return Streamed(self._stream(replica, p, job), lambda: replica.abandon(job))

    async def _stream(self, replica: Replica, p: Prepared,
                      job: Job) -> AsyncIterator[list[int] | Served]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[list[int] | Served | BaseException | None] = asyncio.Queue()

        def on_step(ids: list[int]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, ids)

        def work() -> None:
            item: Served | BaseException | None
            try:
                item = self._decode(replica, p, job, on_step)
            except BaseException as exc:
                item = exc
            loop.call_soon_threadsafe(queue.put_nowait, item)

        self._submit(replica, job, work)
        started = False
        try:
            while True:
                item = await (queue.get() if started else
                              within_queue_bound(replica, job, queue.get()))
                started = True
                if isinstance(item, BaseException):
                    raise item
                if item is None:  # abandoned
                    return
                yield item
                if isinstance(item, Served):
                    return
        finally:
            replica.abandon(job)

    def _decode(self, replica: Replica, p: Prepared, job: Job,
                on_step: Callable[[list[int]], None] | None) -> Served | None:
        """On the decode thread: run the engine, then report. None if abandoned."""
        if not replica.begin(job):
            return None
        try:
            started = time.perf_counter()
            k = replica.k_for(job, p.version)
            gen = native_engine(p.version.engine).stream(p.prompt_ids, p.params, k=k)
            for ids in gen:
                if on_step is not None:
                    on_step(ids)
                if job.cancel.is_set():
                    gen.close()
                    replica.metrics.abandoned.labels("decoding").inc()
                    log.info("request abandoned after %d steps of decoding", job.steps + 1)
                    return None
                job.steps += 1
            assert gen.result is not None
            result = gen.result
            ended = time.perf_counter()
            served = Served(p.version, result, latency_s=ended - p.ctx.arrived,
                            ttft_s=started - p.ctx.arrived + result.stats.ttft_s,
                            concurrency=replica.concurrency(job), in_flight=job.in_flight, k=k)
            replica.report(p, served)
            return served
        finally:
            replica.end(job)
