"""The load loop: ``concurrency`` client threads, optional rate pacing, bounded by a request
count and/or a duration; the domain of each request drawn from the schedule's mix at its
start time.

Pacing: request ``i`` may start no earlier than ``t0 + i / rate`` (``rate`` requests per
second, ``None``: as fast as the clients go). With more load than the server takes, the
clients fall behind the pace rather than pile up requests (at most ``concurrency`` in
flight). The run stops by itself when ``requests`` have been started or ``duration_s`` has
passed (requests in flight finish), or when ``stop`` is set (Ctrl-C in the CLI).

:func:`summarize` turns results into the figures the CLI prints: requests, errors (counted
by kind in ``error_kinds``, the first message of each kind in ``error_messages``), req/s,
latency p50/p99, output tokens/s (streamed requests: time to first token p50 and each
request's tokens/s after it, :func:`~autospec.loadgen.client.decode_rate`), and τ
(:func:`autospec.engine.stats.tau` over the requests' summed counts: mean accepted + 1 per
verification step, bonus included; None where no request had a step) — overall, per
version and per segment. A request drafted by several versions (it straddled an in-place
swap: ``drafted_by``) counts once, under its response's ``version``; ``straddled`` says how
many did, overall and per version and segment.
"""

from __future__ import annotations

import logging
import random
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

from autospec.engine import stats
from autospec.loadgen.client import Driver, Result, decode_rate
from autospec.loadgen.mix import Schedule
from autospec.loadgen.source import Prompt

log = logging.getLogger(__name__)


class Source(Protocol):
    def next(self, domain: str) -> Prompt: ...


@dataclass(frozen=True)
class LoadSpec:
    """How much load, how fast, in which mix."""

    schedule: Schedule
    concurrency: int = 1
    rate: float | None = None
    requests: int | None = None
    duration_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests is None and self.duration_s is None:
            raise ValueError("give a request count or a duration: the run must end by itself")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.requests is not None and self.requests < 0:
            raise ValueError(f"requests must be >= 0, got {self.requests}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration must be > 0 s, got {self.duration_s}")


class _Pacer:
    """Hands out request slots: (index, scheduled start), or None when the run is over."""

    def __init__(self, spec: LoadSpec, stop: threading.Event) -> None:
        self.spec, self.stop = spec, stop
        self.t0 = time.perf_counter()
        self.rng = random.Random(spec.seed)
        self._i = 0
        self._lock = threading.Lock()

    def take(self) -> tuple[int, str] | None:
        with self._lock:
            i = self._i
            if self.spec.requests is not None and i >= self.spec.requests:
                return None
            self._i += 1
        at = self.t0 + (i / self.spec.rate if self.spec.rate else 0.0)
        end = self.t0 + self.spec.duration_s if self.spec.duration_s else None
        if end is not None and at >= end:
            return None
        if self.stop.wait(max(0.0, at - time.perf_counter())):
            return None
        now = time.perf_counter()
        if end is not None and now >= end:
            return None
        with self._lock:
            domain = self.spec.schedule.pick(now - self.t0, self.rng)
        return i, domain


def run_load(spec: LoadSpec, source: Source, driver: Driver, *,
             on_result: Callable[[Result], None] | None = None,
             stop: threading.Event | None = None) -> list[Result]:
    """Run the load; results in start order."""
    stop = stop or threading.Event()
    pacer = _Pacer(spec, stop)
    results: list[Result] = []
    lock = threading.Lock()

    def client() -> None:
        while (slot := pacer.take()) is not None:
            index, domain = slot
            result = driver.send(source.next(domain), index=index,
                                 start_s=time.perf_counter() - pacer.t0)
            with lock:
                results.append(result)
            if on_result is not None:
                on_result(result)

    with ThreadPoolExecutor(max_workers=spec.concurrency, thread_name_prefix="loadgen") as pool:
        futures = [pool.submit(client) for _ in range(spec.concurrency)]
        try:
            while wait(futures, timeout=0.5).not_done:
                pass
        except KeyboardInterrupt:
            log.warning("interrupted: finishing the requests in flight")
            stop.set()
        for future in futures:
            future.result()  # a client thread's own error (not a failed request) surfaces
    return sorted(results, key=lambda r: r.index)


def tau(results: list[Result]) -> float | None:
    """τ over the verification steps of ``results`` (None without any step)."""
    return stats.tau(sum(r.num_accepted_tokens for r in results),
                     sum(r.num_drafts for r in results))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(results: list[Result], wall_s: float) -> dict[str, Any]:
    """The run's figures (JSON-able); latency in ms, rates per second of wall time."""
    ok = [r for r in results if r.ok]
    lat = [1e3 * r.latency_s for r in ok]
    errors: dict[str, int] = {}
    messages: dict[str, str | None] = {}
    for r in results:
        if not r.ok:
            errors[r.error or "error"] = errors.get(r.error or "error", 0) + 1
            messages.setdefault(r.error or "error", r.error_message)
    tokens = sum(r.completion_tokens for r in ok)
    ttft = [1e3 * r.ttft_s for r in ok if r.ttft_s is not None]
    return {
        "requests": len(results), "ok": len(ok), "errors": len(results) - len(ok),
        "error_kinds": errors, "error_messages": messages, "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "p50_ms": statistics.median(lat) if lat else None,
        "p99_ms": percentile(lat, 0.99) if lat else None,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "tau": tau(ok),
        "straddled": sum(straddled(r) for r in ok),
        "ttft_p50_ms": statistics.median(ttft) if ttft else None,
        "decode_tokens_per_s": decode_rate(ok) if ttft else None,
        "by_version": _group(ok, lambda r: r.version or "?"),
        "by_segment": _group(ok, lambda r: r.segment),
    }


def straddled(result: Result) -> bool:
    """Whether more than one version drafted ``result`` (a swap happened while it ran)."""
    return len(set(result.drafted_by)) > 1


def _group(results: list[Result], key: Callable[[Result], str]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    return {name: {"requests": len(rs), "tau": tau(rs),
                   "p50_ms": statistics.median(1e3 * r.latency_s for r in rs),
                   "completion_tokens": sum(r.completion_tokens for r in rs),
                   "straddled": sum(straddled(r) for r in rs)}
            for name, rs in sorted(groups.items())}
