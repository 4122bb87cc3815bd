"""The application's metrics hub: one small Serve deployment holding every replica's latest
Prometheus exposition, so that one scrape of ``GET /metrics`` covers the whole deployment.

Each :class:`~autospec.serve.app.AutospecServer` replica sends its exposition every
``PUSH_INTERVAL_S`` (:class:`MetricsPusher`, a daemon thread) and answers ``/metrics`` with
:meth:`MetricsHub.collect`: every replica's series, labelled ``replica``, with the vLLM-like
names unchanged (Ray's own metrics export would rename them ``ray_autospec_...``: it drops
``:``). A replica that stops sending (gone) drops out after ``STALE_AFTER_S``. The hub keeps
only the latest text per replica, in memory; it is rebuilt by the next pushes if restarted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ray import serve

from autospec.serve.metrics import merge_expositions

log = logging.getLogger(__name__)

PUSH_INTERVAL_S = 2.0
STALE_AFTER_S = 30.0


#: the replicas' pushes (one per replica every PUSH_INTERVAL_S) are not requests anyone
#: needs in the log: Serve's access log would print a "CALL put OK" line for each
@serve.deployment(name="AutospecMetrics", num_replicas=1, max_ongoing_requests=1000,
                  ray_actor_options={"num_cpus": 0},
                  logging_config={"enable_access_log": False})
class MetricsHub:
    """The latest exposition of each replica of the application."""

    def __init__(self) -> None:
        self.latest: dict[str, tuple[float, str]] = {}

    def put(self, replica: str, text: str) -> None:
        self.latest[replica] = (time.monotonic(), text)

    def collect(self) -> bytes:
        now = time.monotonic()
        self.latest = {r: v for r, v in self.latest.items() if now - v[0] <= STALE_AFTER_S}
        return merge_expositions({r: text for r, (_, text) in self.latest.items()})


class MetricsPusher:
    """A daemon thread sending ``exposition()`` to the hub as ``replica`` every interval."""

    def __init__(self, hub: Any, replica: str, exposition: Callable[[], bytes],
                 interval_s: float = PUSH_INTERVAL_S) -> None:
        self.hub, self.replica, self.exposition = hub, replica, exposition
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autospec-metrics-push",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def push(self) -> None:
        self.hub.put.remote(self.replica, self.exposition().decode()).result(timeout_s=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.push()
            except Exception as exc:  # the hub restarting; the next push retries
                log.warning("metrics push to the hub failed: %s", exc)
            self._stop.wait(self.interval_s)
