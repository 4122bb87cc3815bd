"""``autospec demo --quick`` end to end (local Ray, two Serve apps, the controller) on a tiny
random-init target with SmolLM2's tokenizer and a handful of requests per phase: the
report, chart and JSON exist and every phase is there. The figures of a random-init model
mean nothing (the gate may well reject); the real-model figures come from ``make demo``.
Runs in a subprocess (its own Ray). Deselect with ``-m "not demo"``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve.helpers import make_tiny_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.demo, pytest.mark.timeout(600)]


def test_quick_demo_on_a_tiny_target_writes_report_chart_and_json(tmp_path: Path) -> None:
    model = make_tiny_model_dir(tmp_path / "tiny")
    out, figures = tmp_path / "report", tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, "-m", "autospec.cli", "demo", "--quick", "--target", str(model),
         "--requests-per-phase", "6", "--max-tokens", "8", "--out", str(out),
         "--json", str(figures)],
        capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(figures.read_text())
    names = [p["name"] for p in data["phases"]]
    assert names == ["A1", "A2", "B1", "B2", "M1", "M2"]
    for phase in data["phases"]:
        assert phase["requests"] >= 1 and phase["errors"] == 0
        assert phase["live_version"] is not None and phase["tau_live"] is not None
        assert phase["tokens_per_s"] > 0 and phase["paired_prompts"] >= 1
        assert phase["speedup"] > 0
    assert data["phases"][0]["live_version"] == "builtin-ngram"
    assert data["decisions"] and data["decisions"][0]["kind"] == "cycle"
    for phase in data["phases"][-2:]:  # the mixed phases: both segments, each measured
        assert set(phase["segments"]) == {"json", "support"}
        assert all(s["served_by"] for s in phase["segments"].values())
    mix = data["mix"]
    assert mix["phase"] == "M2" and {r["segment"] for r in mix["segments"]} == \
        {"json", "support"}
    assert mix["note"] and all(r["shadow_one"] is not None for r in mix["segments"])
    assert {s["app"] for s in data["samples"]} == {"live", "target"}
    chart = out / "tau.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "| A1 |" in report and "Controller decisions" in report
    assert "## Mixed traffic (M2): per-segment versions against one" in report
    assert "τ live" in proc.stdout and (out / "data" / "autospec.db").exists()
