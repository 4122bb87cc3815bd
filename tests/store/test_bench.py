"""`autospec bench store` runs end to end on a small number of rows."""

from __future__ import annotations

import json
from pathlib import Path

from autospec.bench.store import main


def test_bench_store_reports_figures(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("AUTOSPEC_TEST_POSTGRES_URL", raising=False)
    monkeypatch.delenv("AUTOSPEC_BENCH_POSTGRES_URL", raising=False)
    out = tmp_path / "bench.json"
    report = main(f"sqlite:///{tmp_path / 'db' / 'autospec.db'}", 300, out)
    sqlite = report["results"]["sqlite"]
    assert sqlite["writer_rows_per_s"] > 0 and sqlite["record_p99_us"] > 0
    assert sqlite["spilled"] == sqlite["dropped"] == 0
    assert "skipped" in report["results"]["postgresql"]
    saved = json.loads(out.read_text())
    assert saved["rows"] == 300 and saved["complete"] is True
    err = capsys.readouterr().err
    assert "bench store" in err and "sqlite: writer" in err and "postgresql: skipped" in err
    assert not list((tmp_path / "db").glob("autospec-bench-*"))  # scratch file removed
