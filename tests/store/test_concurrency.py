"""Several processes share one SQLite file (WAL): no "database is locked", no row lost.

4 writer processes (TrafficWriter) + 2 readers + 1 controller (lease + promotions) for
``AUTOSPEC_CONCURRENCY_SECONDS`` (default 20) seconds.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from autospec import store

from . import workers
from .helpers import uid_counts
from .test_registry import register

SECONDS = float(os.environ.get("AUTOSPEC_CONCURRENCY_SECONDS", "20"))


@pytest.mark.slow
def test_four_writers_readers_and_a_controller_share_sqlite(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = store.open_store(sqlite_url, upgrade=True)
    with store.session_scope(engine) as s:
        register(s, tmp_path, "v1")
        register(s, tmp_path, "v2")
    # spawned children import workers by its test-package name (store.workers)
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=workers.writer,
                         args=(sqlite_url, str(tmp_path / "spill"), i, SECONDS, out))
             for i in range(4)]
    procs += [ctx.Process(target=workers.reader, args=(sqlite_url, SECONDS, out))
              for _ in range(2)]
    procs.append(ctx.Process(target=workers.controller,
                             args=(sqlite_url, SECONDS, ["v1", "v2"], out)))
    for p in procs:
        p.start()
    results = [_get(out, procs) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    by_role: dict[str, list[dict]] = {}  # type: ignore[type-arg]
    for r in results:
        by_role.setdefault(r["role"], []).append(r)
    writers, readers, (ctl,) = by_role["writer"], by_role["reader"], by_role["controller"]
    assert all(w["error"] is None for w in writers), [w["error"] for w in writers]
    sent = sum(w["sent"] for w in writers)
    print(f"rows sent={sent} reader loops={[r['loops'] for r in readers]} moves={ctl['moves']}")
    assert uid_counts(engine) == (sent, sent)  # rows written == rows sent, none twice
    for w in writers:
        assert w["locked"] == 0 and w["counters"]["spilled"] == 0, w
        assert w["counters"]["dropped"] == 0 and w["counters"]["written"] == w["sent"]
    for r in readers:
        assert r["errors"] == [] and r["loops"] > 0
    assert ctl["errors"] == [] and ctl["locked"] == 0 and ctl["moves"] > 0
    with store.session_scope(engine, readonly=True) as s:
        assert store.get_live(s).generation == ctl["moves"]


def _get(out, procs, timeout: float = SECONDS + 120) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """Next result; fail fast if a child died without reporting."""
    import queue
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=1)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"worker(s) died: {[(p.name, p.exitcode) for p in dead]}"
    raise AssertionError("workers did not report in time")
