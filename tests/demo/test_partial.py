"""A demo run that ends early (Ctrl-C or a failure) still reports the phases it finished,
marked partial, after shutting serving down; the CLI says so in one line and exits non-zero.
No Ray and no model: the runner's serving, target and controller seams are replaced by fakes
(the end-to-end demo is ``test_demo.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.demo.plan import plan_for
from autospec.demo.run import Demo, DemoStopped
from autospec.loadgen.client import Result


class FakeDriver:
    """Answers every prompt at once on ``builtin-ngram``; ``fail_after`` answers, raises."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.sent, self.fail_after = 0, fail_after

    def send(self, prompt, start_s: float) -> Result:  # type: ignore[no-untyped-def]
        if self.fail_after is not None and self.sent >= self.fail_after:
            raise RuntimeError("replica went away")
        self.sent += 1
        return Result(index=self.sent, segment=prompt.segment, start_s=start_s, latency_s=0.05,
                      ok=True, version="builtin-ngram", completion_tokens=8, num_drafts=4,
                      num_accepted_tokens=4, tau=2.0)


class Interrupting:
    def run_cycle(self, trigger: str):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt


@pytest.fixture
def fake_serving(monkeypatch):  # type: ignore[no-untyped-def]
    """Serving, target, shadow replay and the store wait replaced; records the shutdown."""
    calls: dict[str, int] = {"stopped": 0}

    def start(self) -> None:
        self.live, self.baseline = FakeDriver(calls.get("fail_after")), FakeDriver()

    def stop(self) -> None:
        calls["stopped"] += 1

    monkeypatch.setattr(Demo, "_start_serving", start)
    monkeypatch.setattr(Demo, "_stop_serving", stop)
    monkeypatch.setattr(Demo, "_load_target", lambda self: None)
    monkeypatch.setattr(Demo, "_shadow_tau", lambda self, phase, n: None)
    monkeypatch.setattr(Demo, "_wait_logged", lambda self, timeout_s=30.0: None)
    monkeypatch.setattr(Demo, "_controller", lambda self, drift_window_s=3600.0: Interrupting())
    return calls


PLAN = plan_for("quick").with_overrides(requests_per_phase=4)


def test_ctrl_c_in_the_cycle_keeps_the_finished_phase_and_stops_serving(fake_serving,
                                                                         tmp_path: Path) -> None:
    with pytest.raises(DemoStopped) as info:
        Demo(PLAN, data_dir=tmp_path / "data").run()
    stop = info.value
    assert stop.interrupted and fake_serving["stopped"] == 1
    result = stop.result
    assert result.partial == "interrupted (Ctrl-C) during the controller cycle after A1"
    assert [p.name for p in result.phases] == ["A1"]
    assert result.phases[0].requests == 4 and result.phases[0].tau_live == pytest.approx(2.0)
    assert result.as_dict()["complete"] is False


def test_a_failure_mid_phase_reports_the_phases_before_it(fake_serving, monkeypatch,
                                                          tmp_path: Path) -> None:
    monkeypatch.setattr(Demo, "_cycle", lambda self, after: None)  # no controller
    fake_serving["fail_after"] = 6  # A1 takes 4 live requests; A2 fails at its third
    with pytest.raises(DemoStopped) as info:
        Demo(PLAN, data_dir=tmp_path / "data").run()
    stop = info.value
    assert not stop.interrupted and isinstance(stop.__cause__, RuntimeError)
    assert stop.result.partial == "failed during phase A2: RuntimeError: replica went away"
    assert [p.name for p in stop.result.phases] == ["A1"]
    assert [s.phase for s in stop.result.samples if s.app == "live"] == ["A1"] * 4 + ["A2"] * 2
    assert fake_serving["stopped"] == 1


def test_cli_writes_a_partial_report_and_exits_130_on_ctrl_c(fake_serving,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["demo", "--quick", "--requests-per-phase", "4",
                                      "--out", str(out)])
    assert result.exit_code == 130, result.output
    assert "Traceback" not in result.output
    message = [line for line in result.output.splitlines() if line.startswith("demo ")]
    assert message == [f"demo interrupted (Ctrl-C) during the controller cycle after A1; "
                       f"partial report in {out / 'report.md'}"], result.output
    data = json.loads((out / "demo.json").read_text())
    assert data["complete"] is False and data["partial"].startswith("interrupted")
    assert [p["name"] for p in data["phases"]] == ["A1"]
    report = (out / "report.md").read_text()
    assert "— partial" in report and "Partial report: interrupted (Ctrl-C)" in report
    assert "| A1 |" in report and "phases finished: A1" in report
    assert (out / "tau.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "traceback.txt").exists()  # Ctrl-C is no error


def test_cli_failure_exits_1_with_the_traceback_in_a_file(fake_serving, monkeypatch,
                                                          tmp_path: Path) -> None:
    monkeypatch.setattr(Demo, "_cycle", lambda self, after: None)
    fake_serving["fail_after"] = 6
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["demo", "--quick", "--requests-per-phase", "4",
                                      "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "demo failed during phase A2: RuntimeError: replica went away" in result.output
    assert "replica went away" in (out / "traceback.txt").read_text()
    report = (out / "report.md").read_text()
    assert "phase A2 did not finish (its 2 live responses" in report


def test_the_cycle_line_shows_why_the_promoted_candidate_won() -> None:
    """Two candidates passed; the line names the promoted one's reasons, not the last ones."""
    from autospec.demo.control import headline_reasons

    reasons = ["suffix-1: Δτ = +0.6", "suffix-1: speedup ok", "eagle3-1: Δτ = +0.5",
               "eagle3-1: segment ok", "eagle3-1: speedup ok"]
    assert headline_reasons(reasons, "suffix-1") == reasons[:2]
    assert headline_reasons(reasons, None) == reasons[-3:]
    based = [*reasons, "eagle3-0 (base): Δτ = +0.7", "eagle3-0 (base): speedup ok"]
    assert headline_reasons(based, "eagle3-0") == based[-2:]
