"""``controller once|run|watch --target`` naming no target is refused before any cycle, in
one line, exit 2 (found by an operator trial, 2026-12-07: `controller once --target
nosuchmodel` started a cycle, snapshotted its window, and failed it on the target's load with
a traceback in the log; under `controller run` every scheduled cycle would have been
recorded failed so). A target that goes missing under a running controller fails the cycle
with its one line, no traceback. Real SQLite file, tiny target."""

from __future__ import annotations

import logging

from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.controller import records
from autospec.controller.cycle import Controller
from autospec.engine.target import TargetLoadError

from .helpers import fast_policy, log_traffic, write_policy

runner = CliRunner()


def test_a_target_that_names_none_is_refused_before_any_cycle(db, sqlite_url, traffic,
                                                              tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    log_traffic(db, traffic)
    policy = write_policy(tmp_path / "policy.yaml")
    for command in ("once", "watch"):
        result = runner.invoke(app, ["controller", command, "--policy", str(policy),
                                     "--target", str(tmp_path / "nosuchmodel")])
        assert result.exit_code == 2, result.output
        assert " ".join(result.output.split()) == (
            f"error: target '{tmp_path / 'nosuchmodel'}' is neither a known name "
            "(smollm2-135m), a model directory nor a .gguf file")
    with store.session_scope(db, readonly=True) as session:
        assert records.cycles(session, deployment="default") == []


def test_a_target_gone_under_a_running_controller_fails_the_cycle_in_one_line(
        db, traffic, caplog) -> None:  # type: ignore[no-untyped-def]
    def gone() -> None:
        raise TargetLoadError("target '/models/t' is neither a known name (smollm2-135m), a "
                              "model directory nor a .gguf file")

    log_traffic(db, traffic)
    caplog.set_level(logging.INFO)
    result = Controller(db, fast_policy(), gone).run_cycle(trigger="schedule")
    assert result.outcome == "failed"
    assert result.reasons[-1].startswith("target '/models/t' is neither"), result.reasons
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
