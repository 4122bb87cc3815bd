"""Read-side queries over traffic, plus the retention purge.

- :func:`traffic_window` — requests usable for training (not opted out, with token ids) in a
  time window, oldest first, split into a *train* part and the newest *held-out* part; the
  split is by time, so nothing held out is older than anything trained on.
- :func:`live_tau` — acceptance length τ observed live, per speculator version (and per
  segment), over a time window: :func:`autospec.engine.stats.tau` of the summed counts, the
  mean over verification steps of accepted + 1 (bonus token included; None without a
  step), plus per-position acceptance.
- :func:`request_counts` — request counts, optionally grouped.
- :func:`purge_requests` — delete requests older than a cutoff, or strip their client text
  (text, ids, and ``sampling`` down to what an opted-out row keeps).

Opted-out rows count in τ and counts (their statistics are kept) but never in a window.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import ColumnElement, Select, delete, func, or_, select, update
from sqlalchemy.orm import Session

from autospec.engine.stats import tau
from autospec.store.codec import unpack_ids
from autospec.store.errors import StoreError
from autospec.store.models import Request, utcnow
from autospec.store.privacy import opted_out_sampling
from autospec.store.synthetic import purge_resampled

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrafficExample:
    """One request as training/evaluation data."""

    id: int
    request_uid: str
    created_at: datetime
    segment: str
    speculator_version: str | None
    prompt_ids: list[int]
    output_ids: list[int]
    temperature: float
    sampling: dict[str, Any] | None
    num_drafts: int
    num_accepted_tokens: int


@dataclass(frozen=True)
class TrafficWindow:
    """Train part (older) and held-out part (newest) of a window of traffic."""

    train: list[TrafficExample]
    heldout: list[TrafficExample]
    start: datetime | None
    end: datetime | None
    split_at: datetime | None  # every held-out row is at or after this time

    @property
    def total(self) -> int:
        return len(self.train) + len(self.heldout)


_EXAMPLE_COLUMNS = (
    Request.id,
    Request.request_uid,
    Request.created_at,
    Request.segment,
    Request.speculator_version,
    Request.prompt_ids,
    Request.output_ids,
    Request.temperature,
    Request.sampling,
    Request.num_drafts,
    Request.num_accepted_tokens,
)


def _filter(
    query: Select[Any],
    *,
    since: datetime | None,
    until: datetime | None,
    deployment: str | None,
    segment: str | None = None,
) -> Select[Any]:
    if since is not None:
        query = query.where(Request.created_at >= since)
    if until is not None:
        query = query.where(Request.created_at < until)
    if deployment is not None:
        query = query.where(Request.deployment == deployment)
    if segment is not None:
        query = query.where(Request.segment == segment)
    return query


def traffic_window(
    session: Session,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    heldout_fraction: float = 0.1,
    limit: int | None = None,
    deployment: str | None = None,
    segment: str | None = None,
    greedy_only: bool = False,
) -> TrafficWindow:
    """Usable requests in [since, until): the newest ``limit`` of them, split by time.

    The newest ``ceil(n * heldout_fraction)`` rows are held out; rows sharing the boundary
    timestamp all go to the held-out side, so the parts never overlap in time.
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise StoreError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    query = _filter(select(*_EXAMPLE_COLUMNS), since=since, until=until,
                    deployment=deployment, segment=segment)
    query = query.where(
        Request.opted_out.is_(False),
        Request.prompt_ids.is_not(None),
        Request.output_ids.is_not(None),
    )
    if greedy_only:
        query = query.where(Request.temperature == 0.0)
    query = query.order_by(Request.created_at.desc(), Request.id.desc())
    if limit is not None:
        query = query.limit(limit)
    rows = [_example(r) for r in session.execute(query)]
    rows.reverse()  # oldest first
    return _split(rows, heldout_fraction, since, until)


def _example(row: Any) -> TrafficExample:
    return TrafficExample(
        id=row.id,
        request_uid=row.request_uid,
        created_at=row.created_at,
        segment=row.segment,
        speculator_version=row.speculator_version,
        prompt_ids=unpack_ids(row.prompt_ids) or [],
        output_ids=unpack_ids(row.output_ids) or [],
        temperature=row.temperature,
        sampling=row.sampling,
        num_drafts=row.num_drafts,
        num_accepted_tokens=row.num_accepted_tokens,
    )


def _split(
    rows: list[TrafficExample], fraction: float, since: datetime | None, until: datetime | None
) -> TrafficWindow:
    cut = len(rows) - math.ceil(len(rows) * fraction)
    if 0 < cut < len(rows):
        boundary = rows[cut].created_at
        while cut > 0 and rows[cut - 1].created_at == boundary:
            cut -= 1
    split_at = rows[cut].created_at if cut < len(rows) else None
    return TrafficWindow(
        train=rows[:cut],
        heldout=rows[cut:],
        start=since if since is not None else (rows[0].created_at if rows else None),
        end=until if until is not None else (rows[-1].created_at if rows else None),
        split_at=split_at,
    )


@dataclass(frozen=True)
class TauStat:
    """Live acceptance of one version (and segment, if grouped) over a window."""

    version: str | None
    segment: str | None
    requests: int
    steps: int  # verification steps (num_drafts)
    draft_tokens: int
    accepted_tokens: int
    acceptance_by_position: list[float] = field(default_factory=list)

    @property
    def tau(self) -> float | None:
        """Mean over steps of accepted + 1 (bonus included); None without any step."""
        return tau(self.accepted_tokens, self.steps)


def live_tau(
    session: Session,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    deployment: str | None = None,
    by_segment: bool = False,
    versions: list[str] | None = None,
    with_positions: bool = False,
    full_k: bool = False,
    k: int | None = None,
) -> list[TauStat]:
    """τ per version (and per segment) over [since, until), sorted by version then segment.

    ``with_positions`` also computes the acceptance rate at each draft position
    (P(position i accepted | positions < i accepted)) from accepted-per-position (this reads
    one JSON list per request, so it costs a scan of the window).

    ``full_k``: only the requests drafted at their version's k — leaving out those a
    concurrency band drafted fewer tokens for (``sampling.banded``,
    :func:`autospec.serve.bands.drafted_fewer`), whose τ is lower by the band's choice, not
    by the version: what the canary and drift watch compare with an evaluated τ. ``k``:
    leave out the requests a replica recorded at another k (``sampling.k``; rows without one
    are kept), since τ grows with k and an evaluated τ was replayed at one k.
    """
    keys = [Request.speculator_version] + ([Request.segment] if by_segment else [])
    query = select(
        *keys,
        func.count().label("requests"),
        func.coalesce(func.sum(Request.num_drafts), 0).label("steps"),
        func.coalesce(func.sum(Request.num_draft_tokens), 0).label("draft_tokens"),
        func.coalesce(func.sum(Request.num_accepted_tokens), 0).label("accepted"),
    ).group_by(*keys)
    query = _filter(query, since=since, until=until, deployment=deployment)
    if versions is not None:
        query = query.where(Request.speculator_version.in_(versions))
    query = query.where(*_comparable(full_k, k))
    positions = (
        _positions(session, keys, since, until, deployment, versions, full_k, k)
        if with_positions else {}
    )
    stats = []
    for row in session.execute(query):
        key = (row.speculator_version, row.segment if by_segment else None)
        stats.append(TauStat(
            version=key[0], segment=key[1], requests=row.requests, steps=int(row.steps),
            draft_tokens=int(row.draft_tokens), accepted_tokens=int(row.accepted),
            acceptance_by_position=_rates(positions.get(key), int(row.steps)),
        ))
    return sorted(stats, key=lambda s: (s.version or "", s.segment or ""))


def _positions(
    session: Session,
    keys: list[Any],
    since: datetime | None,
    until: datetime | None,
    deployment: str | None,
    versions: list[str] | None,
    full_k: bool = False,
    k: int | None = None,
) -> dict[tuple[str | None, str | None], list[int]]:
    query = _filter(select(*keys, Request.accepted_per_position), since=since, until=until,
                    deployment=deployment).where(Request.accepted_per_position.is_not(None))
    if versions is not None:
        query = query.where(Request.speculator_version.in_(versions))
    query = query.where(*_comparable(full_k, k))
    sums: dict[tuple[str | None, str | None], list[int]] = {}
    for row in session.execute(query):
        key = (row[0], row[1] if len(keys) > 1 else None)
        acc = sums.setdefault(key, [])
        for i, n in enumerate(row.accepted_per_position):
            if i == len(acc):
                acc.append(0)
            acc[i] += int(n)
    return sums


def _comparable(full_k: bool, k: int | None) -> list[ColumnElement[bool]]:
    """With ``full_k``, rows whose ``sampling.banded`` is not true (missing, as on rows a
    band did not cut and on rows written before replicas recorded it, counts as not banded);
    with ``k``, rows whose ``sampling.k`` is ``k`` or not recorded. No condition: every row."""
    where = [Request.sampling["banded"].as_boolean().is_not(True)] if full_k else []
    if k is not None:
        recorded = Request.sampling["k"].as_integer()
        where.append(or_(recorded.is_(None), recorded == k))
    return where


def _rates(accepted: list[int] | None, steps: int) -> list[float]:
    rates, before = [], steps
    for n in accepted or []:
        rates.append(n / before if before else 0.0)
        before = n
    return rates


GroupBy = Literal["version", "segment", "deployment"]
_GROUP_COLUMNS = {
    "version": Request.speculator_version,
    "segment": Request.segment,
    "deployment": Request.deployment,
}


def request_counts(
    session: Session,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    group_by: GroupBy | None = None,
    include_opted_out: bool = True,
    deployment: str | None = None,
) -> dict[str | None, int]:
    """Requests in [since, until) (of ``deployment``; None: of every one); ``{None: n}``
    ungrouped, else ``{group value: n}``."""
    if group_by is not None and group_by not in _GROUP_COLUMNS:
        raise StoreError(f"group_by must be one of {sorted(_GROUP_COLUMNS)}, not {group_by!r}")
    column = _GROUP_COLUMNS[group_by] if group_by else None
    query = select(*([column] if column is not None else []), func.count()).select_from(Request)
    query = _filter(query, since=since, until=until, deployment=deployment)
    if not include_opted_out:
        query = query.where(Request.opted_out.is_(False))
    if column is None:
        return {None: session.scalar(query) or 0}
    return {key: n for key, n in session.execute(query.group_by(column))}


def purge_requests(
    session: Session,
    *,
    older_than: timedelta,
    text_only: bool = False,
    now: datetime | None = None,
) -> int:
    """Delete requests older than ``older_than`` (or, ``text_only``, strip their text and ids
    and cut their ``sampling`` to what an opted-out row keeps:
    :func:`autospec.store.privacy.opted_out_sampling`), and in both cases the synthetic
    sequences resampled from them (they copy the prompt).

    Returns the number of rows affected. Run inside one session; on SQLite the write lock is
    held for the duration, so purge regularly rather than rarely.
    """
    cutoff = _cutoff(older_than, now)
    resampled = purge_resampled(session, before=cutoff)  # they hold the requests' prompts
    where = _purgeable(cutoff, text_only)
    count = 0
    if text_only:  # sampling as an opt-out keeps it (stop strings, seed, user: client text)
        for batch in _client_sampling(session, cutoff):
            session.execute(update(Request), [{"id": i, "sampling": kept}
                                              for i, kept, _ in batch])
            count += sum(not has_text for _, _, has_text in batch)  # the text update counts
        stmt = update(Request).where(*where).values(prompt_text=None, output_text=None,
                                                    prompt_ids=None, output_ids=None)
    else:
        stmt = delete(Request).where(*where)
    count += session.execute(stmt.execution_options(synchronize_session=False)).rowcount
    log.info("purged %d requests older than %s (text_only=%s) and %d synthetic sequences "
             "resampled from them", count, cutoff, text_only, resampled)
    return count


def count_purgeable(session: Session, *, older_than: timedelta, text_only: bool = False,
                    now: datetime | None = None) -> int:
    """The rows :func:`purge_requests` would affect, read without writing (a dry run takes no
    write lock)."""
    cutoff = _cutoff(older_than, now)
    count = session.scalar(select(func.count()).select_from(Request).where(
        *_purgeable(cutoff, text_only))) or 0
    if text_only:
        count += sum(not has_text for batch in _client_sampling(session, cutoff)
                     for _, _, has_text in batch)
    return count


def _client_sampling(session: Session, cutoff: datetime,
                     size: int = 1000) -> Iterator[list[tuple[int, Any, bool]]]:
    """Batches of ``(id, sampling as an opt-out keeps it, whether text or ids are left)`` of
    the requests older than ``cutoff`` whose ``sampling`` holds more (stop strings, the seed,
    the user), in id order: a batch may be updated before the next is read."""
    has_text = or_(*_has_text())
    last = None
    while True:
        query = select(Request.id, Request.sampling, has_text).where(
            Request.created_at < cutoff, Request.sampling.is_not(None))
        if last is not None:
            query = query.where(Request.id > last)
        rows = session.execute(query.order_by(Request.id).limit(size)).all()
        if not rows:
            return
        last = rows[-1][0]
        batch = [(i, kept, bool(text)) for i, sampling, text in rows
                 if (kept := opted_out_sampling(sampling)) != sampling]
        if batch:
            yield batch


def _cutoff(older_than: timedelta, now: datetime | None) -> datetime:
    if older_than <= timedelta(0):
        raise StoreError(f"older_than must be positive, got {older_than}")
    return (now or utcnow()) - older_than


def _purgeable(cutoff: datetime, text_only: bool) -> list[ColumnElement[bool]]:
    """The requests a purge touches: older than ``cutoff`` (``text_only``: with text left)."""
    where = [Request.created_at < cutoff]
    if text_only:
        where.append(or_(*_has_text()))
    return where


def _has_text() -> list[ColumnElement[bool]]:
    return [Request.prompt_text.is_not(None), Request.prompt_ids.is_not(None),
            Request.output_text.is_not(None), Request.output_ids.is_not(None)]
