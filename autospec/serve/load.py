"""The load a replica serves: requests in flight over time.

:class:`InFlight` counts a replica's requests from admission to the end (waiting or
decoding) and keeps the integral of that count over time, so that each request can be told
the **mean number of requests in flight during its life** (itself included): the load it
was served under. The traffic row records it (``sampling.concurrency``), next to the count
when it started decoding (``sampling.in_flight``) and the k it drafted with; the controller
reads the distribution (:func:`autospec.store.served_concurrency`) and ``autospec status``
shows it.

Not thread-safe by itself: the server calls it under its admission lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Mark:
    """Where a request entered: the time and the load integral then."""

    at: float
    area: float


class InFlight:
    """Requests in flight and their integral over time (request-seconds)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._now = clock
        self.count = 0
        self._area = 0.0
        self._since = self._now()

    def _advance(self) -> float:
        now = self._now()
        self._area += self.count * (now - self._since)
        self._since = now
        return now

    def enter(self) -> Mark:
        now = self._advance()
        self.count += 1
        return Mark(now, self._area)

    def leave(self) -> None:
        self._advance()
        self.count = max(0, self.count - 1)

    def mean_since(self, mark: Mark) -> float:
        """Mean requests in flight from ``mark`` to now (the count now when no time passed)."""
        now = self._advance()
        span = now - mark.at
        return (self._area - mark.area) / span if span > 0 else float(self.count)
