"""``autospec bench soak-report DIR`` judges a finished soak again from the files it left.
The case it was built for: the second 30-minute vLLM soak's only missed goal was a
controller's memory "+50.5 %" — a controller killed inside a cycle, whose floor between
cycles was flat. A run directory is laid out as a soak leaves it (a real SQLite store with
the controller's cycle records, ``memory.jsonl``, ``soak.json`` judged by the rule before);
the command's verdict drops that miss and says what the run's own verdict was."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import update
from typer.testing import CliRunner

from autospec import store
from autospec.bench.soak import accounting as acc
from autospec.bench.soak.config import SoakConfig
from autospec.bench.soak.figures import figures, verdict
from autospec.bench.soak.report import write_report
from autospec.bench.soak.runner import _write_raw
from autospec.bench.soak.storeview import StoreView
from autospec.cli import app
from autospec.store import migrate
from autospec.store.models import Event

MIB = 1 << 20


def _cycle_note(engine, pid: int, outcome: str, at: float) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as session:
        e = store.record_event(session, kind="note", actor=f"vm:{pid}:host", reason=outcome,
                               deployment="default",
                               details={"type": "cycle", "outcome": outcome})
        session.flush()
        session.execute(update(Event).where(Event.id == e.id)
                        .values(created_at=datetime.fromtimestamp(at, UTC)))


Samples = list[tuple[float, str, int]]


def _soak_dir(out: Path, *, rule_before: bool = True) -> tuple[dict, Samples]:  # type: ignore[type-arg]
    """A 20-minute run: controller 4 killed inside its third cycle (minutes 9-11 at twice
    its floor), controller 5 started after it and alive to the end, flat."""
    t0 = time.time() - 3600.0
    (out / "data").mkdir(parents=True)
    url = f"sqlite:///{out / 'data' / 'autospec.db'}"
    engine = store.make_engine(url)
    migrate.upgrade(engine)
    for pid, outcome, minute in ((4, "promoted", 2.5), (4, "rejected", 8.2),
                                 (5, "promoted", 14.5)):
        _cycle_note(engine, pid, outcome, t0 + minute * 60)
    engine.dispose()
    samples = [(t0 + m * 60, "controller[4]", (1000 if m < 9 else 2000) * MIB)
               for m in range(12)]
    samples += [(t0 + m * 60, "controller[5]", (900 if m < 14 else 1500) * MIB)
                for m in range(12, 20)]
    samples += [(t0 + m * 60, "replica[9]", 1200 * MIB) for m in range(20)]
    view = StoreView(url)
    try:
        r = figures(cfg=SoakConfig(duration_s=1200.0, out=out), t0=t0, ended=t0 + 1200,
                    startup_s=30.0, outcomes=[], view=view, faults=[], samples=samples,
                    shutdown={"serve_exit_s": 8.0, "serve_returncode": 0,
                              "processes_seen": 3, "left_running": []},
                    controllers=2, loadavg=[], spill_files=0)
    finally:
        view.close()
    if rule_before:  # the report as the rule before wrote it: each judged to its last sample
        r["memory"] = acc.memory(samples, t0, 120.0,
                                 {"controller[4]": t0 + 150, "controller[5]": t0 + 870})
        r["verdict"] = verdict(r)
    write_report(r, out)
    _write_raw(out, [], samples)
    return r, samples


def test_soak_report_judges_a_killed_controller_up_to_its_last_cycle(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    r, _ = _soak_dir(out)
    assert r["verdict"] == ["controller[4]: memory grew 100.0% after warm-up"]

    res = CliRunner().invoke(app, ["bench", "soak-report", str(out)])
    assert res.exit_code == 0, res.output
    again = json.loads((out / "soak.json").read_text())
    assert again["verdict"] == []
    assert again["rejudged"]["verdict_before"] == r["verdict"]
    assert again["memory"]["controller[4]"]["growth_after_warmup_pct"] == 0.0
    assert again["memory"]["controller[4]"]["judged_until_minute"] == 8
    assert "judged_until_minute" not in again["memory"]["controller[5]"]
    assert again["requests"] == r["requests"] and again["faults"] == r["faults"]
    md = (out / "soak.md").read_text()
    assert "all goals met" in md and "memory grew 100.0%" in md  # the run's own, quoted
    # judged once more: still the run's own verdict quoted, not the first judgement's
    assert CliRunner().invoke(app, ["bench", "soak-report", str(out)]).exit_code == 0
    again = json.loads((out / "soak.json").read_text())
    assert again["rejudged"]["verdict_before"] == r["verdict"]


def test_soak_report_under_the_same_rules_changes_nothing_but_says_it_judged(
        tmp_path: Path) -> None:
    out = tmp_path / "soak"
    r, _ = _soak_dir(out, rule_before=False)
    before = (out / "soak.md").read_text()
    res = CliRunner().invoke(app, ["bench", "soak-report", str(out)])
    assert res.exit_code == 0, res.output
    again = json.loads((out / "soak.json").read_text())
    assert {k: v for k, v in again.items() if k != "rejudged"} == json.loads(json.dumps(r))
    md = (out / "soak.md").read_text()
    said = [line for line in md.splitlines() if "judged again from the run's files" in line]
    assert len(said) == 1 and md.replace("\n\n" + said[0], "", 1) == before


def test_soak_report_refuses_a_directory_that_is_not_a_soak(tmp_path: Path) -> None:
    """One line saying what is missing (it had been re-worded as a parse error, the first
    one's repr inside: ``not a soak's figures (NotASoak("… is missing: …"))``)."""
    res = CliRunner().invoke(app, ["bench", "soak-report", str(tmp_path / "nowhere")])
    assert res.exit_code == 2
    assert res.output == f"bench soak-report: {tmp_path / 'nowhere'}: no such directory\n"
    (tmp_path / "a-file").write_text("x")
    res = CliRunner().invoke(app, ["bench", "soak-report", str(tmp_path / "a-file")])
    assert res.exit_code == 2
    assert res.output == (f"bench soak-report: {tmp_path / 'a-file'}: a file, not a soak's "
                          "run directory\n")
    res = CliRunner().invoke(app, ["bench", "soak-report", str(tmp_path)])
    assert res.exit_code == 2
    assert res.output.startswith(f"bench soak-report: {tmp_path / 'soak.json'} is missing: "
                                 "not a finished soak's directory")
    assert "NotASoak" not in res.output and "figures" not in res.output
    (tmp_path / "soak.json").write_text("{}")
    res = CliRunner().invoke(app, ["bench", "soak-report", str(tmp_path)])
    assert res.exit_code == 2 and "not a soak's figures" in res.output
    assert not (tmp_path / "data").exists()  # nothing created in a stranger's directory
