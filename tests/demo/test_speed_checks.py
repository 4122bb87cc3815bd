"""Each promotion's gate speedup against the speedup the next phase realised (no serving:
a hand-built result), in the JSON, the Markdown and the console table."""

from __future__ import annotations

import json

from autospec.demo.report import speed_rows, write_json, write_markdown
from autospec.demo.run import DecisionNote, DemoResult, PhaseFigures
from autospec.demo.speed_checks import speed_checks


def _phase(name: str, start: float, version: str, speedup: float | None) -> PhaseFigures:
    return PhaseFigures(name=name, title=name, domain="support", start_t=start,
                        end_t=start + 10, requests=10, versions={version: 10}, speedup=speedup)


def _result() -> DemoResult:
    phases = [_phase("A1", 0, "builtin-ngram", 1.1), _phase("A2", 30, "eagle3-x", 1.6),
              _phase("B1", 60, "eagle3-x", 0.9), _phase("B2", 90, "suffix-y", 1.5)]
    decisions = [
        DecisionNote(20, "A1", "cycle", "promoted", "eagle3-x", [],
                     {"measured": 1.8, "estimated": 3.1}),
        DecisionNote(50, "A2", "canary", "canary_passed", "eagle3-x", []),
        DecisionNote(80, "B1", "cycle", "promoted", "suffix-y", [],
                     {"measured": 2.2, "estimated": 1.4}),
        DecisionNote(85, "B1", "cycle", "promoted", "suffix-z", [],
                     {"measured": None, "estimated": 1.2}),  # never served a phase
    ]
    return DemoResult(plan={"mode": "full", "engine": "native", "max_tokens": 8, "k": 5,
                            "baseline_every": 4}, target="t", data_dir="d", took_s=100.0,
                      phases=phases, decisions=decisions, samples=[], events=[])


def test_each_promotion_is_checked_against_the_phase_it_served_next() -> None:
    checks = speed_checks(_result())
    assert [c["version"] for c in checks] == ["eagle3-x", "suffix-y", "suffix-z"]
    first, second, third = checks
    assert first["realised_in"] == "A2" and first["realised"] == 1.6
    assert abs(first["gate_over_realised"] - 1.8 / 1.6) < 1e-9 and first["within"] is True
    assert abs(first["estimated_over_realised"] - 3.1 / 1.6) < 1e-9
    assert second["realised_in"] == "B2" and second["within"] is False  # 2.2 / 1.5 = 1.47
    assert third["realised"] is None and third["within"] is None


def test_the_checks_are_in_the_json_and_the_markdown(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = _result()
    write_json(result, tmp_path / "demo.json")
    data = json.loads((tmp_path / "demo.json").read_text())
    assert [c["within"] for c in data["speed_checks"]] == [True, False, None]
    assert data["decisions"][0]["gate_speedup"] == {"measured": 1.8, "estimated": 3.1}
    write_markdown(result, tmp_path / "report.md", None)
    text = (tmp_path / "report.md").read_text()
    assert "## Speed: the gate's figure against the realised one" in text
    assert "| eagle3-x | A1 | 1.80× | 3.10× | A2 | 1.60× | 1.12 | yes |" in text
    assert speed_rows(result)[1][-1] == "no"


def test_a_decision_without_a_version_reads_cleanly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = _result()
    result.decisions.append(DecisionNote(95, "B2", "cycle", "rejected", None, ["suffix-w: Δτ"]))
    write_markdown(result, tmp_path / "report.md", None)
    text = (tmp_path / "report.md").read_text()
    assert "- **rejected** (t = 95 s, after B2)\n  - suffix-w: Δτ" in text
    assert "- **promoted** eagle3-x (t = 20 s, after A1)" in text


def test_swaps_in_the_serving_engine_are_listed_with_their_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = _result()
    result.events = [
        {"kind": "promotion", "version": "suffix-y", "actor": "c", "reason": "r", "at": "t0",
         "from_version": "builtin-ngram", "details": {}},
        {"kind": "swap", "version": "suffix-y", "actor": "replica", "reason": "r", "at": "t1",
         "from_version": "builtin-ngram",
         "details": {"mode": "new engine", "seconds": 21.5,
                     "why": "vLLM method ngram -> custom_class (another kind)"}},
        {"kind": "swap", "version": "suffix-z", "actor": "replica", "reason": "r", "at": "t2",
         "from_version": "suffix-y", "details": {"mode": "in-place", "seconds": 0.12,
                                                 "why": None}}]
    write_markdown(result, tmp_path / "report.md", None)
    text = (tmp_path / "report.md").read_text()
    assert "## Swaps in the serving engine" in text
    assert ("| t1 | builtin-ngram | suffix-y | new engine | 21.50 | vLLM method ngram -> "
            "custom_class (another kind) |") in text
    assert "| t2 | suffix-y | suffix-z | in-place | 0.12 | — |" in text
