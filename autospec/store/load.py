"""The load a deployment's replicas served, from the traffic rows.

Each row written since replicas record it carries ``sampling.concurrency``: the mean number
of requests in flight on its replica during its life (:mod:`autospec.serve.load`).
:func:`served_concurrency` summarizes the newest rows' values: the load the deployment
actually serves, which ``autospec status`` shows and a speed measurement should be made at.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autospec.store.models import Request


@dataclass(frozen=True)
class ConcurrencyProfile:
    """Requests in flight per replica as the newest ``requests`` rows saw it."""

    requests: int
    p50: float
    p90: float
    max: float
    mean: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def recorded_concurrency(sampling: Any) -> float | None:
    """A row's ``sampling.concurrency`` (None: not recorded)."""
    value = sampling.get("concurrency") if isinstance(sampling, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def served_concurrency(session: Session, *, deployment: str, newest: int = 1000,
                       since: datetime | None = None) -> ConcurrencyProfile | None:
    """The concurrency of ``deployment``'s newest ``newest`` requests that recorded it
    (since ``since``); None when none did."""
    query = (select(Request.sampling).where(Request.deployment == deployment)
             .order_by(Request.id.desc()).limit(newest))
    if since is not None:
        query = query.where(Request.created_at >= since)
    values = sorted(x for s in session.scalars(query)
                    if (x := recorded_concurrency(s)) is not None)
    if not values:
        return None
    return ConcurrencyProfile(requests=len(values), p50=_quantile(values, 0.5),
                              p90=_quantile(values, 0.9), max=values[-1],
                              mean=statistics.fmean(values))
