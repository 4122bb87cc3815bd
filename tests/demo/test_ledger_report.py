"""The demo's report carries the ledger of the demo's own period: read back from the store
the run used (here a fresh SQLite store with a few timed rows and a cycle that measured the
target-only rate), written as a markdown section and under ``ledger`` in the JSON."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from autospec import store
from autospec.demo.record import DemoResult, demo_ledger
from autospec.demo.report import write_json, write_markdown
from autospec.store.models import utcnow


def _store(tmp_path: Path):  # type: ignore[no-untyped-def]
    engine = store.open_store(f"sqlite:///{tmp_path / 'demo.db'}", upgrade=True)
    now = utcnow()
    store.write_requests(engine, [store.RequestRecord(
        segment="support", speculator_version="builtin-ngram", output_tokens=21,
        latency_ms=1100.0, ttft_ms=100.0, created_at=now - timedelta(seconds=5),
        opted_out=True)])
    with store.session_scope(engine) as session:
        ev = store.record_evaluation(session, candidate="builtin-ngram", incumbent=None,
                                     decision="reject", per_segment={
                                         "speed": {"tokens_per_s": {"target-only": 10.0}}})
        session.flush()
        for details in ({"type": "cycle_start", "cycle_id": "c"},
                        {"type": "cycle", "cycle_id": "c", "evaluations": [ev.id],
                         "stages": {"training": 0.1}}):
            store.record_event(session, kind="note", actor="demo", deployment="default",
                               details=details)
    return engine


def test_the_report_has_the_ledger_of_the_demo_period(tmp_path: Path) -> None:
    engine = _store(tmp_path)
    ledger = demo_ledger(engine, took_s=60.0)
    assert ledger is not None and ledger["total"]["tokens"] == 20
    assert ledger["total"]["saved_s"] == 1.0  # 20 tokens at 10/s, decoded in 1 s
    result = DemoResult(plan={"mode": "quick", "max_tokens": 32, "k": 4, "baseline_every": 5},
                        target="tiny", data_dir=str(tmp_path), took_s=60.0, phases=[],
                        decisions=[], samples=[], events=[], ledger=ledger)
    write_markdown(result, tmp_path / "report.md", None)
    report = (tmp_path / "report.md").read_text()
    assert "## Ledger: did the loop pay for itself?" in report
    assert "| support | 1 | 20 | 1.0 | 2.0 | 1.0 |" in report
    write_json(result, tmp_path / "demo.json")
    assert json.loads((tmp_path / "demo.json").read_text())["ledger"]["loop"]["cycles"] == 1


def test_a_partial_report_without_a_readable_store_has_no_ledger(tmp_path: Path) -> None:
    engine = store.open_store(f"sqlite:///{tmp_path / 'gone.db'}", upgrade=True)
    engine.dispose()
    (tmp_path / "gone.db").unlink()
    (tmp_path / "gone.db").mkdir()  # not a database any more
    assert demo_ledger(engine, took_s=5.0, strict=False) is None
    assert demo_ledger(None, took_s=5.0) is None
