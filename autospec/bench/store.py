"""``autospec bench store``: how fast the traffic store ingests request rows.

For SQLite (a scratch file next to the configured database, or in a temporary directory)
and PostgreSQL (a scratch database created on the server of ``database_url`` /
``AUTOSPEC_BENCH_POSTGRES_URL`` / ``AUTOSPEC_TEST_POSTGRES_URL``, dropped afterwards; skipped
with the reason when no server answers) it measures:

- ``writer_rows_per_s``: rows recorded through :class:`~autospec.store.writer.TrafficWriter`
  until ``flush()`` returns (end to end: queue, privacy rules, batched executemany, commit);
- ``insert_rows_per_s``: synchronous batched inserts of 500 rows a transaction;
- ``record_p50_us`` / ``record_p99_us``: the caller-side time of one ``record()`` call.

Goals (from the issue): ≥ 10,000 rows/s on SQLite, ``record()`` p99 < 100 µs.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autospec.bench.progress import BenchProgress

log = logging.getLogger(__name__)

GOAL_SQLITE_ROWS_PER_S = 10_000
GOAL_RECORD_P99_US = 100.0
BATCH = 500


def _payloads(rows: int, seed: int = 0) -> list[dict[str, Any]]:
    """Realistic rows: ~200-token prompts, ~128-token outputs, drafting statistics."""
    rng = random.Random(seed)
    words = ["the", "model", "speculative", "token", "cache", "draft", "verify", "accept"]
    out = []
    for i in range(rows):
        prompt_ids = [rng.randrange(49_152) for _ in range(200)]
        output_ids = [rng.randrange(49_152) for _ in range(128)]
        out.append({
            "prompt_text": " ".join(rng.choice(words) for _ in range(150)),
            "output_text": " ".join(rng.choice(words) for _ in range(100)),
            "prompt_ids": prompt_ids,
            "output_ids": output_ids,
            "segment": ("chat", "code", "summarize")[i % 3],
            "speculator_version": "bench-v1",
            "deployment": "bench",
            "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 128},
            "latency_ms": 120.0,
            "ttft_ms": 15.0,
            "num_drafts": 40,
            "num_draft_tokens": 160,
            "num_accepted_tokens": 88,
            "accepted_per_position": [36, 27, 16, 9],
        })
    return out


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _measure(url: str, payloads: list[dict[str, Any]], spill_dir: Path) -> dict[str, Any]:
    from autospec.store import db, migrate
    from autospec.store.traffic import RequestRecord, write_requests
    from autospec.store.writer import TrafficWriter

    engine = db.make_engine(url)
    migrate.upgrade(engine)
    writer = TrafficWriter(engine, spill_dir=spill_dir, max_queue=len(payloads) + 1,
                           batch_size=BATCH)
    timings = []
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for fields in payloads:
        t = clock()
        writer.record(**fields)
        timings.append(clock() - t)
    writer.flush(timeout=600)
    writer_s = time.perf_counter() - start
    counters = writer.counters
    writer.close()

    records = [RequestRecord(**p) for p in payloads]
    start = time.perf_counter()
    for i in range(0, len(records), BATCH):
        write_requests(engine, records[i : i + BATCH])
    insert_s = time.perf_counter() - start
    engine.dispose()

    timings.sort()
    return {
        "rows": len(payloads),
        "writer_rows_per_s": round(len(payloads) / writer_s),
        "insert_rows_per_s": round(len(payloads) / insert_s),
        "record_p50_us": round(_percentile(timings, 0.50) / 1000, 2),
        "record_p99_us": round(_percentile(timings, 0.99) / 1000, 2),
        "record_max_us": round(timings[-1] / 1000, 1) if timings else None,
        "spilled": counters.spilled,
        "dropped": counters.dropped,
    }


def _sqlite_target(database_url: str | None, scratch: Path) -> str:
    from sqlalchemy.engine import make_url

    directory = scratch
    if database_url and make_url(database_url).get_backend_name() == "sqlite":
        database = make_url(database_url).database
        if database and database != ":memory:":
            directory = Path(database).expanduser().parent  # same disk as the real database
            directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{directory / f'autospec-bench-{uuid.uuid4().hex[:8]}.db'}"


def _postgres_server(database_url: str | None) -> str | None:
    from sqlalchemy.engine import make_url

    if database_url and make_url(database_url).get_backend_name() == "postgresql":
        return database_url
    return (os.environ.get("AUTOSPEC_BENCH_POSTGRES_URL")
            or os.environ.get("AUTOSPEC_TEST_POSTGRES_URL"))


def _bench_postgres(server: str, payloads: list[dict[str, Any]], spill: Path) -> dict[str, Any]:
    from sqlalchemy import text

    from autospec.store import db

    admin = db.make_engine(server).execution_options(isolation_level="AUTOCOMMIT")
    db.ping(admin)
    name = f"autospec_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = admin.url.set(database=name).render_as_string(hide_password=False)
        return _measure(url, payloads, spill)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main(database_url: str | None, rows: int, json_path: Path | None) -> dict[str, Any]:
    """Run the benchmark, print a line per database and a table, write JSON as it goes
    (``json_path``); return the figures."""
    from autospec.store.errors import StoreError

    payloads = _payloads(rows)
    results: dict[str, Any] = {}
    report: dict[str, Any] = {"rows": rows, "results": results}
    progress = BenchProgress("bench store", report, json_path)
    with tempfile.TemporaryDirectory(prefix="autospec-bench-") as tmp:
        scratch = Path(tmp)
        sqlite_url = _sqlite_target(database_url, scratch)
        try:
            with progress.stage(f"sqlite: {rows} rows"):
                results["sqlite"] = _measure(sqlite_url, payloads, scratch / "spill-sqlite")
            progress.done(_line("sqlite", results["sqlite"]))
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(sqlite_url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
        server = _postgres_server(database_url)
        if server is None:
            results["postgresql"] = {"skipped": "no PostgreSQL URL (AUTOSPEC_BENCH_POSTGRES_URL)"}
        else:
            try:
                with progress.stage(f"postgresql: {rows} rows"):
                    results["postgresql"] = _bench_postgres(server, payloads,
                                                            scratch / "spill-pg")
            except (StoreError, Exception) as exc:  # a bench reports what it could not measure
                results["postgresql"] = {"skipped": f"{type(exc).__name__}: {exc}"}
        progress.done(_line("postgresql", results["postgresql"]))
    report["goals"] = _goals(results)
    progress.finish()
    _print(report)
    return report


def _line(name: str, r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"{name}: skipped ({r['skipped']})"
    return (f"{name}: writer {r['writer_rows_per_s']:,} rows/s, batched insert "
            f"{r['insert_rows_per_s']:,} rows/s, record() p99 {r['record_p99_us']} µs")


def _goals(results: dict[str, Any]) -> dict[str, Any]:
    sqlite = results["sqlite"]
    return {
        "sqlite_rows_per_s": {"goal": GOAL_SQLITE_ROWS_PER_S,
                              "value": sqlite["writer_rows_per_s"],
                              "met": sqlite["writer_rows_per_s"] >= GOAL_SQLITE_ROWS_PER_S},
        "record_p99_us": {"goal": GOAL_RECORD_P99_US, "value": sqlite["record_p99_us"],
                          "met": sqlite["record_p99_us"] < GOAL_RECORD_P99_US},
    }


def _print(report: dict[str, Any]) -> None:
    table = Table(title=Text(f"traffic store ingest ({report['rows']} request rows)",
                             style="table.title"))
    for column in ("database", "writer rows/s", "batched insert rows/s", "record() p50 µs",
                   "record() p99 µs", "spilled", "dropped"):
        table.add_column(column, justify="right" if column != "database" else "left")
    for name, r in report["results"].items():
        if "skipped" in r:
            table.add_row(Text(name), Text(f"skipped: {r['skipped']}"), "", "", "", "", "")
            continue
        table.add_row(*map(Text, (name, f"{r['writer_rows_per_s']:,}",
                                  f"{r['insert_rows_per_s']:,}", f"{r['record_p50_us']}",
                                  f"{r['record_p99_us']}", str(r["spilled"]), str(r["dropped"]))))
    console = Console()
    console.print(table)
    for goal, g in report["goals"].items():
        mark = ("met", "green") if g["met"] else ("missed", "red")
        console.print(Text.assemble(f"goal {goal}: {g['value']} vs {g['goal']} — ", mark))
