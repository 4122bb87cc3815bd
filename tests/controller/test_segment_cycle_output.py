"""What ``controller once``, the cycle's log line and ``status``'s recent cycles say of a
cycle that moved pointers — the deployment's, a segment's, or both — on a tiny random-init
target (the traffic of test_segment_cycle.py: cycle 1 promotes for the deployment, cycle 2's
candidate fails the deployment's gate but wins the ``support`` segment).

A cycle that moved only a segment's pointer printed ``promoted `` with a blank name, its
one reason the deployment's gate failure (reading as the cycle's verdict), and the move
itself only in a log line on stderr; status's row showed ``—``."""

from __future__ import annotations

import json
from datetime import timedelta

from rich.console import Console
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.controller import records
from autospec.controller.result import CycleResult, headline, moves
from autospec.controller.scheduler import cycle_summary

from .helpers import (
    T0,
    TEST_POLICY,
    events,
    greedy_traffic,
    live_requests,
    log_traffic,
    write_policy,
)
from .test_segment_cycle import _log, _serving

runner = CliRunner()

POLICY = (TEST_POLICY.replace("min_segment_requests: 1000", "min_segment_requests: 5")
          .replace("max_requests: 200", "max_requests: 80")
          .replace("min_train_requests: 5}", "min_train_requests: 5, from_scratch: true}")
          + "promotion: {per_segment: {enabled: true, min_requests: 5}}\n")


def test_headline_names_the_deployments_move_and_each_segments() -> None:
    segments = [{"segment": "chat", "action": "kept", "version": None},
                {"segment": "json", "action": "promoted", "version": "v2"},
                {"segment": "support", "action": "follows", "version": "v1"}]
    assert moves("v1", segments) == ["deployment → v1", "segment json → v2"]
    assert headline("promoted", "v1", segments) == "promoted deployment → v1, segment json → v2"
    assert headline("promoted", None, segments) == "promoted segment json → v2"
    assert headline("rejected", None, segments[:1]) == "rejected"
    assert CycleResult("promoted", promoted="v1").headline == "promoted deployment → v1"
    only = CycleResult("promoted", cycle_id="c4", candidates=["v2"], segments=segments,
                       reasons=["deployment: kept v0 — v2: Δτ CI includes 0"])
    assert cycle_summary(only) == ("c4 promoted (v2 not promoted for the deployment), segment "
                                   "json → v2; 1 reasons recorded")  # controller run's log


def test_a_cycle_moving_only_a_segment_says_so_on_a_tiny_random_init_target(
        db, sqlite_url, tiny, tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    monkeypatch.setattr("autospec.engine.target.load_target", lambda *a, **k: tiny)
    for module in ("autospec.controller.cli", "autospec.controller.run_cli"):
        monkeypatch.setattr(f"{module}.out", Console(width=400))  # no folded lines
    policy = str(write_policy(tmp_path / "policy.yaml", POLICY))
    json_pairs = greedy_traffic(tiny, seed=0)
    support = greedy_traffic(tiny, seed=1, repeats=17)
    _log(db, json_pairs, ["json"] * len(json_pairs), start=T0)
    first = runner.invoke(app, ["controller", "once", "--policy", policy, "--json"])
    assert first.exit_code == 0, first.output
    deployed = json.loads(first.stdout)["promoted"]

    held = [pair for i in range(12) for pair in (json_pairs[i], support[56 + i])]
    _log(db, support[:56] + held, ["support"] * 56 + ["json", "support"] * 12,
         start=T0 + timedelta(minutes=10))
    with caplog.at_level("INFO", logger="autospec.controller.cycle"):
        second = runner.invoke(app, ["controller", "once", "--policy", policy])
    assert second.exit_code == 0, second.output
    winner = _serving(db, "support")
    assert winner not in (None, deployed) and _serving(db, "json") == deployed
    lines = second.stdout.splitlines()
    assert lines[0] == f"promoted segment support → {winner}", second.stdout
    assert len(lines) >= 3 and any("regresses" in line for line in lines), second.stdout
    assert all(line.startswith(f"  • deployment: kept {deployed} — {winner}: ")
               for line in lines[1:]), second.stdout  # the deployment's gate failure, as such
    logged = [r.getMessage() for r in caplog.records if ": promoted" in r.getMessage()]
    assert logged and logged[-1].endswith(f": promoted segment support → {winner}"), logged

    status = runner.invoke(app, ["status", "--policy", policy])
    assert status.exit_code == 0, status.output
    newer, older = [[cell.strip() for cell in line.split("│")[4:7]]  # outcome, moved, why
                    for line in status.stdout.splitlines() if "│ once " in line]
    assert newer[:2] == ["promoted", f"segment support → {winner}"], status.stdout
    assert newer[2].startswith(f"deployment: kept {deployed} — {winner}: ")
    assert older[:2] == ["promoted", f"deployment → {deployed}"] and older[2].startswith(deployed)


def test_a_watch_that_ran_a_drift_cycle_prints_the_cycle_on_a_tiny_random_init_target(
        db, sqlite_url, tiny, traffic, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``controller watch`` printed the drift and its reason, nothing of the cycle it ran."""
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    monkeypatch.setattr("autospec.engine.target.load_target", lambda *a, **k: tiny)
    monkeypatch.setattr("autospec.controller.run_cli.out", Console(width=400))
    policy = str(write_policy(tmp_path / "policy.yaml"))
    log_traffic(db, traffic)
    first = runner.invoke(app, ["controller", "once", "--policy", policy, "--json"])
    version = json.loads(first.stdout)["promoted"]
    (promo,) = [e for e in events(db, "promotion") if e.version == version]
    live_requests(db, version, n=10, tau=promo.details["shadow_tau"])  # the canary passes
    assert runner.invoke(app, ["controller", "watch", "--policy", policy]).exit_code == 0
    live_requests(db, version, n=20, tau=1.1)  # acceptance collapses: traffic changed
    log_traffic(db, traffic[:8], start=T0 + timedelta(minutes=30))  # a little fresh traffic
    watched = runner.invoke(app, ["controller", "watch", "--policy", policy])
    assert watched.exit_code in (0, 3), watched.output
    with store.session_scope(db, readonly=True) as session:
        (cycle, *_) = records.cycles(session, deployment="default")
    assert cycle.start["trigger"] == "drift" and cycle.outcome in ("promoted", "rejected")
    lines = watched.stdout.splitlines()
    assert lines[0] == f"drift {version}" and "below its evaluated τ" in lines[1], lines
    moved = ", ".join(moves(cycle.end["promoted"], cycle.end["segments"]))  # type: ignore[index]
    at = lines.index(f"  cycle {cycle.cycle_id}: {cycle.outcome} {moved}".rstrip())
    assert [line[len("    • "):] for line in lines[at + 1:]] == cycle.end["reasons"]  # type: ignore[index]
