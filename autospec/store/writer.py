"""The traffic writer: the serving path's only contact with the database.

``TrafficWriter.record(...)`` appends to an in-memory queue and returns (a few µs; it never
touches the database, the disk or a lock shared with the writer thread). A background thread
takes batches off the queue, applies the privacy rules, and writes each batch with one Core
``executemany`` in one transaction.

Nothing is lost:

- on a database failure (unreachable, locked, read-only, schema missing) the batch goes to the
  append-only spill file (:mod:`autospec.store.spill`) and the writer backs off exponentially;
  while it backs off new batches go straight to the spill file;
- after the next successful write (or a due retry) the spill files are replayed — this
  writer's own and any left behind by dead processes — and deleted once committed;
- if the queue is full (the database is slow rather than down), ``record`` spills the row
  itself: slower for that call, but the row is kept;
- rows are keyed by ``request_uid`` and inserted with ON CONFLICT DO NOTHING, so a batch that
  committed but whose acknowledgement was lost is not stored twice when it is replayed;
- ``flush()`` waits until every row recorded so far is committed or spilled; ``close()``
  flushes, tries the spill once more, and stops the thread (also run at interpreter exit).

A process killed outright (SIGKILL, the OOM killer) loses the rows still in its queue: those
recorded since the last batch, every ``flush_interval_s`` (50 ms) plus the batch's
transaction. A SIGTERM or an orderly exit flushes them (``close``).

A row is *dropped* only if it cannot be stored at all (a value the database rejects, a number
out of range) or if the spill file itself cannot be written; each drop is logged with its uid.
Counters (:class:`WriterCounters`) are exposed for metrics, e.g. via
:func:`register_prometheus`.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Engine
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    SQLAlchemyError,
    StatementError,
)

from autospec.store.db import writer_engine
from autospec.store.privacy import Redactor, redact_default
from autospec.store.spill import SpillFile, claim_orphans, keep_rows, read_rows
from autospec.store.traffic import RequestRecord, insert_rows, prepare_row

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriterCounters:
    """Rows written from the queue, spilled to disk, replayed from disk, dropped; queue depth."""

    written: int
    spilled: int
    replayed: int
    dropped: int
    queued: int
    database_up: bool

    def as_dict(self) -> dict[str, int | bool]:
        return asdict(self)


class _Marker:
    """Put in the queue by flush(): set once everything before it is written or spilled."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


def _is_row_error(exc: BaseException) -> bool:
    """True if the batch failed because of its data (retrying it unchanged cannot help)."""
    if isinstance(exc, IntegrityError | DataError):
        return True
    return isinstance(exc, StatementError) and not isinstance(exc, DBAPIError)


class TrafficWriter:
    """Non-blocking, loss-free writer of request rows (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        *,
        spill_dir: str | Path | None = None,
        max_queue: int = 10_000,
        batch_size: int = 500,
        flush_interval_s: float = 0.05,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        redact: Redactor | None = redact_default,
    ) -> None:
        if spill_dir is None:
            from autospec.settings import get_settings

            spill_dir = get_settings().resolved_spill_dir
        self._engine = writer_engine(engine)
        self._spill_dir = Path(spill_dir)
        self._spill = SpillFile(self._spill_dir)
        self.max_queue, self.batch_size = max_queue, batch_size
        self._interval = flush_interval_s
        self._backoff_initial, self._backoff_max = backoff_initial_s, backoff_max_s
        self._redact = redact
        self._queue: deque[Any] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._written = self._spilled = self._replayed = self._dropped = 0
        self._overflow_lock = threading.Lock()
        self._backoff = 0.0
        self._retry_at = 0.0
        self._check_orphans = True
        self.last_error: str | None = None
        self._thread = threading.Thread(
            target=self._run, name="autospec-traffic-writer", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)

    # -- caller side -------------------------------------------------------------------------

    def record(self, record: RequestRecord | None = None, /, **fields: Any) -> None:
        """Enqueue one request (a :class:`RequestRecord` or its fields as keywords)."""
        if record is None:
            record = RequestRecord(**fields)
        elif fields:
            raise TypeError("pass a RequestRecord or keyword fields, not both")
        if self._stopping:
            raise RuntimeError("TrafficWriter is closed")
        queue = self._queue
        if len(queue) >= self.max_queue:
            self._overflow(record)
            return
        queue.append((record, time.time()))
        if len(queue) >= self.batch_size:
            self._wake.set()

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything recorded so far is committed or spilled; False on timeout."""
        marker = _Marker()
        self._queue.append(marker)
        self._wake.set()
        return marker.done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Flush, retry the spill file once, stop the thread. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        atexit.unregister(self.close)
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("traffic writer did not stop within %.1fs", timeout)
        self._spill.close()

    def __enter__(self) -> TrafficWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def counters(self) -> WriterCounters:
        return WriterCounters(
            written=self._written,
            spilled=self._spilled,
            replayed=self._replayed,
            dropped=self._dropped,
            queued=sum(1 for item in list(self._queue) if not isinstance(item, _Marker)),
            database_up=self._backoff == 0.0,
        )

    def _overflow(self, record: RequestRecord) -> None:
        with self._overflow_lock:
            row = self._prepare(record, time.time())
            if row is not None:
                self._to_spill([row])

    # -- writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            stopping = self._stopping
            try:
                self._drain()
                if self._spill_due():
                    self._replay()
            except Exception:  # last resort: the thread must outlive any bug below
                log.exception("traffic writer loop failed; continuing")
            if stopping and not self._queue:
                break
        self._retry_at = 0.0  # one last try, ignoring the backoff
        try:
            self._replay()
        except Exception:
            log.exception("traffic writer final replay failed; rows stay in %s", self._spill_dir)

    def _drain(self) -> None:
        while self._queue:
            rows: list[dict[str, Any]] = []
            markers: list[_Marker] = []
            while self._queue and len(rows) < self.batch_size:
                item = self._queue.popleft()
                if isinstance(item, _Marker):
                    markers.append(item)
                    break
                row = self._prepare(*item)
                if row is not None:
                    rows.append(row)
            if rows:
                self._deliver(rows)
            for marker in markers:
                marker.done.set()

    def _prepare(self, record: RequestRecord, created: float) -> dict[str, Any] | None:
        try:
            return prepare_row(record, created=created, redact=self._redact)
        except (TypeError, ValueError, OverflowError) as exc:
            self._dropped += 1
            log.error("dropped request %s: cannot store it: %s", record.request_uid, exc)
            return None

    def _deliver(self, rows: list[dict[str, Any]]) -> None:
        if time.monotonic() < self._retry_at:
            self._to_spill(rows)
            return
        done = self._store(rows, "written")
        if done < len(rows):
            self._to_spill(rows[done:])
        else:
            self._replay()

    def _store(self, rows: list[dict[str, Any]], counter: str) -> int:
        """Store rows; return how many, from the front, are settled (stored or rejected).

        A batch the database rejects for its data is retried row by row and the bad rows are
        dropped; a database failure stops early (the caller keeps the rest).
        """
        error = self._try_insert(rows)
        if error is None:
            self._count(counter, len(rows))
            return len(rows)
        if not _is_row_error(error):
            self._database_down(error)
            return 0
        for done, row in enumerate(rows):
            error = self._try_insert([row])
            if error is None:
                self._count(counter, 1)
            elif _is_row_error(error):
                self._dropped += 1
                log.error("dropped request %s: rejected by the database: %s",
                          row["request_uid"], getattr(error, "orig", error))
            else:
                self._database_down(error)
                return done
        return len(rows)

    def _try_insert(self, rows: list[dict[str, Any]]) -> SQLAlchemyError | None:
        try:
            with self._engine.begin() as conn:
                insert_rows(conn, rows)
        except SQLAlchemyError as exc:
            return exc
        self._database_up()
        return None

    def _count(self, counter: str, n: int) -> None:
        if counter == "written":
            self._written += n
        else:
            self._replayed += n

    def _database_down(self, exc: BaseException) -> None:
        self._backoff = min(self._backoff_max, max(self._backoff * 2, self._backoff_initial))
        self._retry_at = time.monotonic() + self._backoff * random.uniform(0.8, 1.2)
        message = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        if message != self.last_error:
            log.warning("traffic database unavailable (%s); spilling, retry in %.1fs",
                        message, self._backoff)
        self.last_error = message

    def _database_up(self) -> None:
        if self._backoff:
            log.info("traffic database reachable again")
        self._backoff, self._retry_at, self.last_error = 0.0, 0.0, None

    def _to_spill(self, rows: list[dict[str, Any]]) -> None:
        try:
            self._spill.append(rows)
        except OSError as exc:
            self._dropped += len(rows)
            log.error("dropped %d requests: database down and spill file failed: %s",
                      len(rows), exc)
            return
        self._spilled += len(rows)
        self._check_orphans = True

    def _spill_due(self) -> bool:
        if time.monotonic() < self._retry_at:
            return False
        return self._spill.pending or self._check_orphans

    def _replay(self) -> None:
        """Replay this writer's spill file and any orphaned ones, while the database is up."""
        if time.monotonic() < self._retry_at:
            return
        self._check_orphans = False
        own = self._spill.hand_over()
        if own is not None and not self._replay_file(*own):
            self._check_orphans = True  # the aside file is unlocked now: adopt it later
            return
        for path, fh in claim_orphans(self._spill_dir, own=self._spill.path):
            if not self._replay_file(path, fh):
                self._check_orphans = True
                return

    def _replay_file(self, path: Path, fh: IO[str]) -> bool:
        try:
            rows, bad = read_rows(fh, path)
            self._dropped += bad
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start : start + self.batch_size]
                done = self._store(chunk, "replayed")
                if done < len(chunk):
                    _keep(path, rows[start + done :])
                    return False
            os.unlink(path)
            if rows:
                log.info("replayed %d spilled requests from %s", len(rows), path)
            return True
        finally:
            fh.close()


def _keep(path: Path, rows: list[dict[str, Any]]) -> None:
    """Leave only ``rows`` (not stored yet) in the spill file at ``path``; where that cannot
    be written (a full disk) the file stays whole and is replayed whole later (a stored row
    is skipped by its ``request_uid``)."""
    try:
        keep_rows(path, rows)
    except OSError as exc:
        log.warning("spill file %s kept whole, could not write the %d rows left (%s)",
                    path, len(rows), exc)


def register_prometheus(
    writer: TrafficWriter, registry: Any = None, prefix: str = "autospec"
) -> Any:
    """Expose ``writer.counters`` as Prometheus metrics (``<prefix>_traffic_rows_*``)."""
    from prometheus_client import REGISTRY
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self) -> Any:
            c = writer.counters
            rows = CounterMetricFamily(
                f"{prefix}_traffic_rows", "request rows by outcome", labels=["outcome"]
            )
            for outcome in ("written", "spilled", "replayed", "dropped"):
                rows.add_metric([outcome], getattr(c, outcome))
            yield rows
            yield GaugeMetricFamily(f"{prefix}_traffic_queue_depth", "rows queued", c.queued)
            yield GaugeMetricFamily(
                f"{prefix}_traffic_database_up", "1 if the last write succeeded", int(c.database_up)
            )

    collector = _Collector()
    (registry or REGISTRY).register(collector)
    return collector
