"""The ledger (:mod:`autospec.ledger`) as Prometheus gauges on a replica's
``/metrics``.

The controller serves no HTTP, and the replicas' ``/metrics`` is what operators already
scrape (merged across replicas by :mod:`autospec.serve.metrics_hub`), so each replica with a
store exports its deployment's ledger over the last :data:`PERIOD` — read from the store
at most every :data:`REFRESH_S` seconds, at scrape (or hub push) time, never on a request's
path. Every replica exports the same figures (each labelled ``replica`` after the merge):
aggregate them with ``max by (segment)``, not ``sum``.

| metric | meaning |
|---|---|
| ``autospec:ledger_saved_seconds{segment}`` | decode seconds speculation saved |
| ``autospec:ledger_decode_seconds{segment}`` | decode seconds the requests took |
| ``autospec:ledger_loop_seconds{segment}`` | the cycles' seconds (a segment: its share) |
| ``autospec:ledger_net_seconds{segment}`` | saved − loop |
| ``autospec:ledger_target_only_tokens_per_second`` | R, the target-only rate (below) |
| ``autospec:ledger_holdout_requests`` | the period's held-out requests (below) |
| ``autospec:ledger_period_seconds`` | the period the figures cover |

R is the rate of the period's requests served with speculation off as the control group
(:mod:`autospec.serve.holdout`) where there are :data:`~autospec.ledger.HOLDOUT_MIN_REQUESTS`
of them, else the gate's. The total is the series with ``segment="(all)"``. Figures that
cannot be known (no measured target-only rate) are left out rather than exported as 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)

PERIOD = timedelta(days=1)
REFRESH_S = 60.0
_FIGURES = (("saved_s", "saved", "Decode seconds speculation saved over the period."),
            ("decode_s", "decode", "Decode seconds (latency − TTFT) the requests took."),
            ("loop_s", "loop", "Seconds the controller's cycles spent (a segment: its share)."),
            ("net_s", "net", "Saved minus the loop's seconds (positive: the loop paid)."))


class LedgerCollector:
    """Exports the ledger of ``deployment`` from store ``db``, refreshed every ``refresh_s``."""

    def __init__(self, db: Any, *, deployment: str, period: timedelta = PERIOD,
                 refresh_s: float = REFRESH_S) -> None:
        self.db, self.deployment, self.period, self.refresh_s = db, deployment, period, refresh_s
        self._ledger: dict[str, Any] | None = None
        self._at = float("-inf")
        self._lock = threading.Lock()

    def ledger(self) -> dict[str, Any] | None:
        """The cached ledger, recomputed when older than ``refresh_s`` (the last one is
        kept when the store cannot be read)."""
        from autospec.ledger import ledger_for
        from autospec.store.errors import StoreError

        with self._lock:
            if time.monotonic() - self._at >= self.refresh_s:
                self._at = time.monotonic()
                try:
                    self._ledger = ledger_for(self.db, deployment=self.deployment,
                                              period=self.period)
                except StoreError as exc:
                    log.warning("ledger metrics not refreshed: %s", exc)
            return self._ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ledger = self.ledger()
        if ledger is None:
            return
        lines = [ledger["total"], *ledger["segments"]]
        for key, name, doc in _FIGURES:
            family = GaugeMetricFamily(f"autospec:ledger_{name}_seconds", doc,
                                       labels=["segment"])
            for line in lines:
                if line[key] is not None:
                    family.add_metric([line["segment"]], line[key])
            yield family
        if ledger["target_only"] is not None:
            yield GaugeMetricFamily("autospec:ledger_target_only_tokens_per_second",
                                    "Target-only tokens/s (the ledger's R): the period's "
                                    "held-out requests', else the gate's measurement.",
                                    value=ledger["target_only"]["tokens_per_s"])
        yield GaugeMetricFamily("autospec:ledger_holdout_requests",
                                "Requests of the period served with speculation off as the "
                                "ledger's control group.",
                                value=ledger["holdout"]["requests"])
        yield GaugeMetricFamily("autospec:ledger_period_seconds",
                                "The period the ledger's figures cover.",
                                value=ledger["period_s"])


def register_ledger(registry: Any, db: Any, *, deployment: str) -> LedgerCollector:
    """Add the ledger's gauges to a replica's ``registry``."""
    collector = LedgerCollector(db, deployment=deployment)
    registry.register(collector)
    return collector
